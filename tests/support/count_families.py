"""The counts' schedule families: a start state on the wire server, the actors that run
against it (folds, commits, purges, creations, prune's removal, readers), and what runs them
(tests/support/explore.py, tests/support/count_oracle.py).

Why this module exists: tests/store/test_count_schedules.py explores these families and keeps
the fixed schedules the explorer found; tests/store/test_count_mutations.py plants each guard's
removal and shows the same families catch it. Both need the same world.
"""

from __future__ import annotations

import asyncio
import copy
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Awaitable, Callable, Optional

import pymongo
import pytest
from harel.engine.execution import Execution, Status
from harel.engine.store.base import Step, TimerOp

from harel_beanie.core import commit as commit_module
from harel_beanie.core import flows
from harel_beanie.core.calls import Find, Flow
from harel_beanie.core.commit import CommitRequest
from harel_beanie.core.count_documents import counts_collection
from harel_beanie.core.flows import purging as purging_module
from harel_beanie.core.flows.counting import build
from harel_beanie.core.stuck import QUIET
from harel_beanie.retention.archive import CollectionArchive
from harel_beanie.retention.pruning import is_candidate
from harel_beanie.retention.removal import CLAIM_FIELDS, claim, hold, remove_held
from harel_beanie.store.dispatch import call, drive
from harel_beanie.store.sync_store import MongoStore
from tests.support.count_oracle import EXES, CountsOracle
from tests.support.explore import Actor, Explorer, Report, _Runner

#: every id of a family shares this family key, so all are in one partition
FAMILY = "fam"
#: the collection prune archives into (its journal beside it)
ARCHIVE = "pruned"


@dataclass(frozen=True)
class Await:
    """Not a flow's call: one of the archive's steps (`CollectionArchive`'s begin, finish,
    recover), made whole as one step of a schedule. The archive's collections are prune's
    alone, so only where prune stops between them matters; a kill inside one is
    tests/retention/test_archive_kills.py's."""

    make: Callable[[], Awaitable[Any]]
    target: str = "archive"


@dataclass
class World:
    """A start state on the wire server, and the actors' building blocks."""

    store: MongoStore
    db: Any
    oracle: CountsOracle
    url: str = ""
    saved: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: the random tokens drawn since the start state: replayed alike in every schedule, so a
    #: state met again is recognised (tests/support/explore.py, `fingerprint`)
    tokens: list[int] = field(default_factory=list)
    drawn: int = 0  # the tokens the start state holds
    #: (id, incarnation) of each removal a prune's removal reported as its own
    reported: list[tuple[Any, Any]] = field(default_factory=list)

    def urandom(self, n: int) -> bytes:
        self.tokens.append(len(self.tokens))
        return len(self.tokens).to_bytes(n, "big")

    @property
    def st(self) -> Any:
        return self.store._state

    @property
    def part(self) -> int:
        return int(self.st.scope.part_of(f"{FAMILY}:x"))

    def execute(self, c: Any) -> Any:
        if isinstance(c, Await):
            return self.loop.run_until_complete(c.make())
        # a structural fact held in every schedule: no call on the executions carries an
        # `$or`, for which the embedded server reads the whole collection (a fold's late mark
        # tries its lineage's forms in turn instead: core/counting.py, `lineage`)
        assert "$or" not in (getattr(c, "filter", None) or {}), f"an $or on the executions: {c}"
        return call(self.store._colls, c)

    _loop: Optional[asyncio.AbstractEventLoop] = None
    _aclient: Any = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    @property
    def aexes(self) -> Any:
        """The executions, on an async client (the archive's calls are the async ones)."""
        if self._aclient is None:
            self._aclient = pymongo.AsyncMongoClient(self.url)
        return self._aclient[self.db.name][EXES]

    def archive(self) -> CollectionArchive:
        return CollectionArchive(self.aexes.database, ARCHIVE, clock=lambda: 1_000_000.0)

    def close(self) -> None:
        if self._aclient is not None:
            self.loop.run_until_complete(self._aclient.close())
        if self._loop is not None:
            self._loop.close()

    def run(self, flow: Flow[Any]) -> Any:
        return drive(flow, self.execute)

    def keep(self) -> None:
        """The start state is what the database holds now."""
        counts = counts_collection("harel")
        self.saved = {EXES: list(self.db[EXES].find({})), counts: list(self.db[counts].find({}))}
        self.saved.update({ARCHIVE: [], ARCHIVE + "_pending": []})  # prune's archive, empty
        self.drawn = len(self.tokens)

    def reset(self) -> None:
        del self.tokens[self.drawn :]  # numbered on from the start state's: never one of its tokens
        self.reported = []
        for name, docs in self.saved.items():
            self.db[name].delete_many({})
            if docs:
                self.db[name].insert_many(copy.deepcopy(docs))
        self.oracle.start()

    # --- the actors -----------------------------------------------------------------------

    def fold(self) -> Flow[Any]:
        return flows.fold_counts(self.st.scope, [self.part])

    def commit(self, execution_id: str, said: Optional[Status] = None, **changes: Any) -> Callable[[], Flow[Any]]:
        """A commit of the execution as the start state holds it, with `changes`, described
        as harel describes it (`Step`: the status it was loaded with, or `said`, a wrong
        description, and the status it writes): a commit that keeps the status is sent
        pinned (core/commit.py)."""
        loaded = self.store.load(execution_id)
        assert loaded is not None

        def make() -> Flow[Any]:
            exe = copy.deepcopy(loaded)
            for k, v in changes.items():
                setattr(exe, k, v)
            step = Step(cause="event", from_status=said or loaded.status, to_status=exe.status)
            return flows.commit(self.st, CommitRequest(exe, step=step))

        return make

    def create(self, execution_id: str) -> Callable[[], Flow[Any]]:
        """A creation of `execution_id` (over a tombstone, or after prune removed it)."""
        return lambda: flows.commit(self.st, CommitRequest(Execution(id=execution_id, definition_id="E")))

    def purge(self, execution_id: str) -> Callable[[], Flow[Any]]:
        loaded = self.store.load(execution_id)
        assert loaded is not None
        return lambda: flows.purge(self.st, execution_id, loaded.version)

    def prune(self, *ids: str, at: float = 1_000_000.0) -> Callable[[], Flow[Any]]:
        """prune's batch over `ids`, as `retention.pruning.prune` runs it with an archive:
        the journal settled, the read, the batch journaled, the removal
        (`retention.removal`, its clock at `at`), the removed archived."""

        def make() -> Flow[Any]:
            archive = self.archive()
            yield Await(lambda: archive.recover(self.aexes, at))
            docs = yield Find("executions", {"_id": {"$in": list(ids)}})
            chosen = [d for d in docs if is_candidate(d, time.time() + 86400)]
            # as prune does: a leaving mark is the removal's, kept apart; one another
            # removal holds is its own
            seen = {d["_id"]: {f: d.pop(f) for f in CLAIM_FIELDS if f in d} for d in chosen}
            chosen = [d for d in chosen if claim(seen[d["_id"]], at) is not None]
            token = f"removal-{len(self.tokens)}"  # the same in every schedule
            self.tokens.append(len(self.tokens))
            held = yield from hold(chosen, seen, token=token, now=at)
            if held:
                yield Await(lambda: archive.begin(held))
            removed = yield from remove_held(self.st.scope, held, token)
            self.reported.extend((d["_id"], d.get("born")) for d in removed)
            if held:
                yield Await(lambda: archive.finish(removed))
            return removed

        return make

    def builder(self) -> Flow[Any]:
        """The family partition's counter built a document a batch (core.counting's last
        paragraph), as a worker's sweeps or `migrate up` build it."""
        return build([self.part], batch=1)

    def reader(self) -> Flow[Any]:
        return self.oracle.reader(lambda: flows.read_counts(self.st.scope))

    def settle(self) -> None:
        """What the next processes do after a schedule (a killed one included): a fold, and
        the next prune's recovery of the journal; then the checks at quiescence, the
        archive's among them: each removal archived once, nothing else archived."""
        self.run(self.fold())
        self.oracle.quiescent()
        self.loop.run_until_complete(self.archive().recover(self.aexes))
        records = list(self.db[ARCHIVE].find({}))
        archived = Counter((r["execution_id"], r["document"].get("born")) for r in records)
        removed = Counter(self.oracle.removed)
        assert archived == removed, f"archived {dict(archived)}, removed {dict(removed)}"
        reported = Counter(self.reported)
        assert reported <= removed and not [k for k, n in reported.items() if n > 1], (
            f"the removals reported {dict(reported)} as their own, removed {dict(removed)}"
        )
        assert self.db[ARCHIVE + "_pending"].count_documents({}) == 0, "the journal was left unsettled"

    def explore(self, actors: list[Actor], progress: bool = True, **bounds: Any) -> Report:
        """Explore `actors` from the start state; `progress` False where a fault planted on
        purpose keeps work undone (prune's re-folds raced out), so only safety is held."""
        # the random samples' seed: printed with the report, and fixed again by the variable
        options: dict[str, Any] = dict(seed=int(os.environ.get("HAREL_BEANIE_EXPLORE_SEED") or time.time()))
        options.update(bounds)
        killed = [False]

        def check(steps: list[Any]) -> None:
            killed[0] = any(s.choice[0] == "kill" for s in steps)
            self.oracle.check(steps)

        def settle() -> None:
            self.settle()
            # progress, in a schedule run to its end without a kill: a removal that marked
            # a document either deleted it or lost its mark to a commit; none is left leaving
            marked = (
                []
                if killed[0] or not progress
                else sorted(d["_id"] for d in self.db[EXES].find({"leaving": True}, {"_id": 1}))
            )
            assert not marked, f"no progress: {marked} left leaving by a schedule run to its end"

        explorer = Explorer(
            actors, self.reset, self.execute, check, settle, fingerprint=self.oracle.fingerprint, **options
        )
        report = explorer.run()
        print(
            f"explored {report.schedules} schedules ({'all' if report.exhausted else 'bounded'}), sampled {report.sampled}, seed {options['seed']}"
        )
        return report


def make_world(store: MongoStore, client: Any, db_name: str, monkeypatch: pytest.MonkeyPatch, url: str) -> World:
    store.init()
    store.fold_counts()  # every partition's counter built (a reader needs them all)
    w = World(store, client[db_name], CountsOracle(client[db_name], extra=[ARCHIVE, ARCHIVE + "_pending"]), url=url)
    # tokens and times the same in every schedule (a commit's, a purge's)
    for module in (commit_module, purging_module):
        monkeypatch.setattr(module, "os", SimpleNamespace(urandom=w.urandom))
    store._state.clock = lambda: 1_000_000.0
    return w


def done(world: World, name: str, *, fold: bool) -> str:
    """An execution DONE long ago, folded or dirty and never folded."""
    exe = Execution(id=f"{FAMILY}:{name}", definition_id="D", status=Status.DONE, finished_at=1.0)
    world.store.save(exe)
    if fold:
        world.store.fold_counts([world.part])
    return exe.id


def running(world: World, name: str) -> str:
    exe = Execution(id=f"{FAMILY}:{name}", definition_id="D", status=Status.RUNNING)
    world.store.save(exe)
    return exe.id


# --- the families: each builds its start state and gives its actors -----------------------


def race(world: World) -> list[Actor]:
    """The race #38 names: an execution DONE, dirty, never folded; a fold reads it and plans
    +1 DONE; prune marks it leaving and folds; the fold's counter update lands first, so
    prune's fails; prune's delete must not take it while the fold's batch counts it."""
    x = done(world, "a", fold=False)
    world.keep()
    return [Actor("fold", world.fold), Actor("prune", world.prune(x))]


def folds_and_a_commit(world: World) -> list[Actor]:
    """Two folders at once over a status change committed while they fold, and an execution
    never folded."""
    x = running(world, "a")
    world.store.fold_counts([world.part])
    running(world, "b")
    world.keep()
    return [
        Actor("fold1", world.fold),
        Actor("fold2", world.fold),
        Actor("commit", world.commit(x, status=Status.DONE, finished_at=1.0)),
    ]


def stalled_folder(world: World) -> list[Actor]:
    """A folder that applies a batch and stalls before marking it, while another marks it,
    a commit changes a document of it, and the other folds that change: the stalled
    folder's marks land last."""
    x = running(world, "a")
    world.store.fold_counts([world.part])
    world.keep()
    return [
        Actor("commit1", world.commit(x, status=Status.DONE, finished_at=1.0)),
        Actor("fold1", world.fold),
        Actor("fold2", world.fold),
        Actor("commit2", world.commit(x, version=2, status=Status.CANCELLED, finished_at=1.0)),
    ]


def reader_and_folds(world: World) -> list[Actor]:
    """A reader between two folders: its answer is the counts at some moment it read."""
    running(world, "a")
    done(world, "b", fold=True)
    running(world, "c")
    world.keep()
    return [Actor("reader", world.reader), Actor("fold1", world.fold), Actor("fold2", world.fold)]


def purge_and_creation(world: World) -> list[Actor]:
    """A purge, a creation over the tombstone it leaves, and a fold."""
    x = done(world, "a", fold=True)
    world.keep()
    return [Actor("purge", world.purge(x)), Actor("create", world.create(x)), Actor("fold", world.fold)]


def prune_and_recreation(world: World) -> list[Actor]:
    """prune removes an execution while a folder folds it, the id is created again, and
    another folder folds."""
    x = done(world, "a", fold=False)
    world.keep()
    return [
        Actor("fold1", world.fold),
        Actor("prune", world.prune(x)),
        Actor("create", world.create(x)),
        Actor("fold2", world.fold),
    ]


def commit_reviving(world: World) -> list[Actor]:
    """A commit between prune's mark and its delete keeps the execution (Rule 5)."""
    x = done(world, "a", fold=True)
    world.keep()
    return [
        Actor("prune", world.prune(x)),
        Actor("commit", world.commit(x, status=Status.RUNNING)),
        Actor("fold", world.fold),
    ]


def state_only_commits(world: World) -> list[Actor]:
    """Commits that keep the status (sent pinned: no `cdirty`, their own `quiet`) racing two
    folders: one on an execution waiting on nothing, one on an execution dirty from before
    (the fold's mark must miss after the commit), one on an execution waiting on a timer
    (its pins miss: sent again marked, never quiet)."""
    x = running(world, "a")
    z = running(world, "c")
    exe = world.store.load(z)
    assert exe is not None
    world.store.commit(exe, [], timers=(TimerOp("schedule", "t", fire_at=2_000_000.0),))
    world.store.fold_counts([world.part])
    y = running(world, "b")  # dirty, never folded
    world.keep()
    return [
        Actor("commit x", world.commit(x, active_path="x.next", updated_at=5.0)),
        Actor("commit y", world.commit(y, active_path="y.next", updated_at=6.0)),
        Actor("commit z", world.commit(z, active_path="z.next", updated_at=7.0)),
        Actor("fold1", world.fold),
        Actor("fold2", world.fold),
    ]


def state_only_and_prune(world: World) -> list[Actor]:
    """A commit that keeps a DONE execution DONE between prune's mark and its delete: its
    pin on the leaving mark misses, and it is sent again unpinned, keeping the execution
    (Rule 5); and a commit whose description is wrong (it says the status stays, it moves:
    a stale description or an old document), which its status pin sends again marked."""
    x = done(world, "a", fold=True)
    y = running(world, "b")
    world.store.fold_counts([world.part])
    world.keep()
    return [
        Actor("prune", world.prune(x)),
        Actor("commit x", world.commit(x, outcome="again")),
        Actor("commit y", world.commit(y, said=Status.DONE, status=Status.DONE, finished_at=1.0)),
        Actor("fold", world.fold),
    ]


def build_commit_and_fold(world: World) -> list[Actor]:
    """A partition's counter built in batches while a commit changes one of its executions
    and a fold (which builds what is left first) runs: the executions as a version before
    the counters left them, no mark on any and no counter."""
    x = running(world, "a")
    done(world, "b", fold=False)
    running(world, "c")
    world.db[EXES].update_many({"part": world.part}, {"$unset": {"cdirty": "", "cc": "", "cseq": "", QUIET: ""}})
    world.db[counts_collection("harel")].delete_one({"_id": world.part})
    world.keep()
    return [
        Actor("build", world.builder),
        Actor("commit", world.commit(x, status=Status.DONE, finished_at=1.0)),
        Actor("fold", world.fold),
    ]


def two_builders(world: World) -> list[Actor]:
    """Two builders of one partition's counter at once (two workers' sweeps, or a sweep and
    `migrate up`), each a document a batch: what one adds the other must not add again."""
    running(world, "a")
    done(world, "b", fold=False)
    world.db[EXES].update_many({"part": world.part}, {"$unset": {"cdirty": "", "cc": "", "cseq": "", QUIET: ""}})
    world.db[counts_collection("harel")].delete_one({"_id": world.part})
    world.keep()
    return [Actor("build1", world.builder), Actor("build2", world.builder)]


class Runner:
    """One actor run by hand, a call at a time (a fixed schedule)."""

    def __init__(self, actor: Actor) -> None:
        self._r = _Runner(actor)

    @property
    def live(self) -> bool:
        return self._r.live

    def step(self, world: World) -> None:
        self._r.step(world.execute)
        world.oracle.check()


def follow(world: World, plan: list[tuple[Runner, int]]) -> None:
    """Run each (runner, n): n of its steps (fewer if it ends), checking after each."""
    for runner, n in plan:
        for _ in range(n):
            if runner.live:
                runner.step(world)
