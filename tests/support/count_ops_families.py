"""The counts' and the archive's schedule families for the operations the docs give an
operator (a counters collection dropped and built again, prunes at once, a purge during a
prune) and for the fold's own recoveries (a fold over several documents beside prune's fold
of its own ids, a purge between a fold's counter update and its marks), with a progress
check beside the safety ones.

Why this module exists: tests/support/count_families.py holds the world and the first
families; these add the operations whose faults the first ones explored past (a rebuilt
counter whose marks were refused, a removal archived by two prunes, a purge archived as a
removal, `_fold_batch`'s recovery of an unmarked batch, `lineage`'s tombstone form).
"""

from __future__ import annotations

from typing import Any, Callable

from harel.engine.execution import Status
from harel.engine.store.base import Step as HarelStep

from harel_beanie.core.calls import DeleteOne, Flow
from harel_beanie.core.flows.counting import build
from harel_beanie.retention.removal import LEASE
from tests.support.count_families import EXES, World, done, running
from tests.support.explore import Actor, Explorer, Report, Step

#: harel's counters collection, where the counters' epochs are numbered (core.counting, Rule 6)
HAREL_COUNTERS = "harel_counters"


def keep(world: World) -> None:
    """The start state, harel's counters collection with it (a rebuild numbers its epoch
    there: restored, every schedule gives it the same one)."""
    world.keep()
    world.saved[HAREL_COUNTERS] = list(world.db[HAREL_COUNTERS].find({}))


def explore(world: World, actors: list[Actor], progress: Callable[[], None], **bounds: Any) -> Report:
    """`world.explore` with `progress` checked after the settling fold of every schedule that
    ran to its end without a kill: what the actors set out to do was done."""
    killed = [False]

    def check(steps: list[Step]) -> None:
        killed[0] = any(s.choice[0] == "kill" for s in steps)
        world.oracle.check(steps)

    def settle() -> None:
        world.settle()
        if not killed[0]:
            progress()

    options: dict[str, Any] = dict(seed=0, sample=0)
    options.update(bounds)
    return Explorer(
        actors, world.reset, world.execute, check, settle, fingerprint=world.oracle.fingerprint, **options
    ).run()


def gone(world: World, *ids: str) -> Callable[[], None]:
    """Progress: each of `ids` removed, and nothing left leaving."""

    def check() -> None:
        left = sorted(d["_id"] for d in world.db[EXES].find({"_id": {"$in": list(ids)}, "tomb": {"$exists": False}}))
        assert not left, f"no progress: {left} not removed by a schedule run to its end"
        marked = sorted(d["_id"] for d in world.db[EXES].find({"leaving": True}))
        assert not marked, f"no progress: {marked} left leaving"

    return check


def settled(world: World) -> Callable[[], None]:
    """Progress where nothing is removed: the settling fold's checks are the work done."""
    return lambda: None


# --- the families ---------------------------------------------------------------------------


def two_removals(world: World) -> tuple[list[Actor], Callable[[], None]]:
    """Two prunes at once over the same batch (two operators' prunes, a worker's retention
    beside a manual one): each removal archived once and reported by one of them only."""
    x = done(world, "a", fold=True)
    y = done(world, "b", fold=False)
    keep(world)
    return [Actor("prune1", world.prune(x, y)), Actor("prune2", world.prune(x, y))], gone(world, x, y)


def purge_inside_removal(world: World) -> tuple[list[Actor], Callable[[], None]]:
    """A purge of an execution prune is removing: archived by neither (a purge is not a
    removal), and the counts count its tombstone."""
    x = done(world, "a", fold=True)
    y = done(world, "b", fold=True)
    keep(world)
    return [Actor("prune", world.prune(x, y)), Actor("purge", world.purge(x)), Actor("fold", world.fold)], settled(
        world
    )


def a_late_removal(world: World) -> tuple[list[Actor], Callable[[], None]]:
    """A prune past another's lease (`LEASE`) takes over what the other marked: the other,
    stalled, must neither remove nor archive it once taken."""
    x = done(world, "a", fold=True)
    keep(world)
    return [
        Actor("prune1", world.prune(x)),
        Actor("prune2", world.prune(x, at=1_000_000.0 + LEASE + 1)),
    ], gone(world, x)


def rebuild_racing_fold(world: World) -> tuple[list[Actor], Callable[[], None]]:
    """The counters collection dropped while a fold runs, and built again (`migrate up`, a
    worker's sweep) a document a batch, while a commit changes an execution marked under
    the dropped counter: the fold's late marks must not change what the rebuilt counter
    counted, and the rebuilt counter's folds must mark what they fold (Rule 6)."""
    x = running(world, "a")
    world.store.fold_counts([world.part])
    y = done(world, "b", fold=True)
    exe = world.store.load(x)
    assert exe is not None
    exe.status = Status.DONE
    exe.finished_at = 1.0
    world.store.commit(exe, [], step=HarelStep(cause="event", from_status=Status.RUNNING, to_status=Status.DONE))
    keep(world)
    part = world.part

    def drop_and_rebuild() -> Flow[Any]:
        yield DeleteOne("counts", {"_id": part})
        return (yield from build([part], batch=1))

    return [
        Actor("fold", world.fold),
        Actor("drop+rebuild", drop_and_rebuild),
        Actor("commit", world.commit(y, status=Status.CANCELLED)),
    ], settled(world)


def fold_beside_prune(world: World) -> tuple[list[Actor], Callable[[], None]]:
    """One fold over two dirty documents, and prune's fold of one of them (its `ids`) beside
    it: a batch the first fold applied and did not mark is marked before prune's batch
    replaces it (Rule 3's recovery in `_fold_batch`)."""
    x = done(world, "a", fold=False)
    running(world, "b")
    keep(world)
    return [Actor("fold", world.fold), Actor("prune", world.prune(x))], gone(world, x)


def fold_purge_prune(world: World) -> tuple[list[Actor], Callable[[], None]]:
    """A fold over two dirty documents, a purge of one of them, and a prune of the other:
    the purged one's entry is marked on its tombstone (`lineage`'s `tomb.buried` form)
    before prune's batch replaces the fold's."""
    x = done(world, "a", fold=False)
    y = done(world, "b", fold=False)
    keep(world)
    return [Actor("fold", world.fold), Actor("purge", world.purge(x)), Actor("prune", world.prune(y))], settled(world)


#: family -> its default bounds: (preemptions, kills, most schedules)
OPS_FAMILIES: dict[Callable[[World], tuple[list[Actor], Callable[[], None]]], tuple[int, int, int]] = {
    two_removals: (2, 0, 40),
    purge_inside_removal: (1, 1, 40),
    a_late_removal: (1, 0, 30),
    rebuild_racing_fold: (2, 0, 40),
    fold_beside_prune: (1, 1, 40),
    fold_purge_prune: (1, 0, 40),
}
