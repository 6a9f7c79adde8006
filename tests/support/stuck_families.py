"""The stuck set's schedule families: timers armed, cancelled, coming due, fired by the sweep
and their bounds repaired, racing commits and folds; after every step the stuck set the views
compute (`queries.backlog`'s list) equals the one the documented definition gives from the
documents (tests/support/stuck_oracle.py), beside the counts' own invariants.

Why this module exists: the views find the stuck executions through what the writes keep
beside them (the timer bound, `quiet`, the fold's mark); a write that leaves one of them
wrong hides an execution from every view while the documents say it is stuck. The counts'
families (tests/support/count_families.py) never arm, cancel or fire a timer. These do, in
the counts' world (the same start states, explorer and counts oracle), with a clock of their
own: the views look at `NOW`, and the sweep fires what is due then.

Progress as well as safety: a schedule that runs to its end without a kill has fired every
timer due when it began that no commit cancelled, and after a settling sweep and fold
nothing is dirty, every bound is exact, and the views still agree.
"""

from __future__ import annotations

import copy
import os
import time
from types import SimpleNamespace
from typing import Any, Callable, Optional

import pytest
from harel.engine.execution import Execution, Status
from harel.engine.store.base import Step as HarelStep
from harel.engine.store.base import TimerOp

from harel_beanie import AsyncMongoStore, queries
from harel_beanie.core import flows
from harel_beanie.core.calls import Flow
from harel_beanie.core.commit import CommitRequest
from harel_beanie.core.stuck import QUIET
from harel_beanie.store.sync_store import MongoStore
from tests.support import count_families
from tests.support.count_families import ARCHIVE, FAMILY, World
from tests.support.count_oracle import EXES, CountsOracle
from tests.support.explore import Actor, Explorer, Report, Step
from tests.support.stuck_oracle import assert_bounds, assert_stuck_set

#: the views' clock and the sweep's, and the threshold they use
NOW = 1_000_000.0
AFTER = 300.0
WEEK = 7 * 86_400.0
#: an hour before the views look: silent, unless something wakes it
SILENT = NOW - 3600.0
#: the message the progress check fails with
LEFT_DUE = "the sweep ran to its end and left due timers armed"


class StuckWorld(World):
    """The counts' world, checking the stuck set and the timer bounds as well, and keeping
    the store's load hints (`StoreState.loaded`) as the start state left them, so every
    schedule replays alike."""

    hints: dict[str, Any]
    killed: bool = False

    def keep(self) -> None:
        super().keep()
        self.hints = copy.deepcopy(self.st.waits)

    def reset(self) -> None:
        super().reset()
        self.st.waits = copy.deepcopy(self.hints)
        self.killed = False

    def shown(self, whole: bool = False) -> list[Any]:
        """The stuck ids the views list at `NOW` (`/backlog`, `/failed`, `/metrics` and
        `status`): `queries.stuck`, the backlog's own stuck list, after every step (a
        fraction of the backlog's reads); the whole `queries.backlog` with `whole`."""
        if whole:
            b = self.loop.run_until_complete(queries.backlog(stuck_after=AFTER, now=NOW, show=50, entries=False))
            return [s["id"] for s in b.stuck]
        rows = self.loop.run_until_complete(queries.stuck(after=AFTER, now=NOW, show=50))
        return [r["id"] for r in rows]

    def check(self, steps: Optional[list[Step]] = None) -> None:
        self.oracle.check(steps)
        self.killed = self.killed or any(s.choice[0] == "kill" for s in steps or ())
        docs = list(self.db[EXES].find({}))
        assert_bounds(docs)
        assert_stuck_set(self.shown(), docs, after=AFTER, now=NOW)

    def sweep(self) -> Flow[Any]:
        """The timer sweep at `NOW`: the due timers read (the bounds found stale repaired),
        each fired (removed, as the runner removes it once its event is delivered)."""
        due = yield from flows.due_timers(self.st, NOW)
        for execution_id, path, fire_at in due:
            yield from flows.delete_timer(self.st, execution_id, path, fire_at)

    def timers(
        self, execution_id: str, *ops: TimerOp, version: Optional[int] = None, hint: bool = True, **changes: Any
    ) -> Callable[[], Flow[Any]]:
        """A commit of the execution with `ops` (arm, cancel), keeping its status (as harel
        describes a step within RUNNING), at `version` (the loaded one unless given). `hint`
        False: as committed by a process that did not load it (no load hint: the commit
        reads the timers itself)."""
        loaded = self.store.load(execution_id)
        assert loaded is not None
        if not hint:
            self.st.waits.pop(execution_id, None)

        def make() -> Flow[Any]:
            exe = copy.deepcopy(loaded)
            exe.version = loaded.version if version is None else version
            for k, v in changes.items():
                setattr(exe, k, v)
            step = HarelStep(cause="event", from_status=loaded.status, to_status=exe.status)
            return flows.commit(self.st, CommitRequest(exe, timers=ops, step=step))

        return make

    def settle(self) -> None:
        """Progress, then what the next processes do: without a kill, every timer due at the
        start that is still armed was fired by the schedule's own sweep; then a settling
        sweep and fold, after which nothing is dirty, each bound is exact (the earliest timer,
        or none) and the views still agree with the documents."""
        docs = list(self.db[EXES].find({}))
        if not self.killed and self.sweeping:
            late = sorted(
                (d["_id"], k) for d in docs for k, at in (d.get("timers") or {}).items() if at <= NOW and k in self.due
            )
            assert not late, f"{LEFT_DUE}: {late}"
        self.run(self.sweep())
        self.run(self.fold())
        self.oracle.quiescent()
        docs = list(self.db[EXES].find({}))
        for d in docs:
            fire_times = list((d.get("timers") or {}).values())
            want = min(fire_times) if fire_times else None
            assert d.get("next_fire") == want, (
                f"{d['_id']!r} settled with bound {d.get('next_fire')}, timers {fire_times}"
            )
        assert_stuck_set(self.shown(whole=True), docs, after=AFTER, now=NOW)

    #: whether a family's actors include a sweep (its progress is checked), and the timer
    #: keys due at the start
    sweeping: bool = False
    due: frozenset[str] = frozenset()

    def explore(self, actors: list[Actor], **bounds: Any) -> Report:
        options: dict[str, Any] = dict(seed=int(os.environ.get("HAREL_BEANIE_EXPLORE_SEED") or time.time()))
        options.update(bounds)
        explorer = Explorer(
            actors, self.reset, self.execute, self.check, self.settle, fingerprint=self.oracle.fingerprint, **options
        )
        report = explorer.run()
        print(f"explored {report.schedules} schedules, sampled {report.sampled}, seed {options['seed']}")
        return report


def make_stuck_world(
    store: MongoStore, client: Any, db_name: str, monkeypatch: pytest.MonkeyPatch, url: str
) -> StuckWorld:
    """As `count_families.make_world`, and the views' documents bound to the world's async
    client (`queries.backlog`)."""
    store.init()
    store.fold_counts()
    db = client[db_name]
    w = StuckWorld(store, db, CountsOracle(db, extra=[ARCHIVE, ARCHIVE + "_pending"]), url=url)
    for module in (count_families.commit_module, count_families.purging_module):
        monkeypatch.setattr(module, "os", SimpleNamespace(urandom=w.urandom))
    store._state.clock = lambda: NOW
    w.loop.run_until_complete(AsyncMongoStore(w.aexes.database.client, db_name, create_schema=False).init())
    return w


def running(world: StuckWorld, name: str, *ops: TimerOp, at: float = SILENT) -> str:
    """A RUNNING execution last updated at `at`, with the timers `ops` arm, folded."""
    exe = Execution(id=f"{FAMILY}:{name}", definition_id="D", status=Status.RUNNING, created_at=at, updated_at=at)
    world.store.commit(exe, [], timers=ops)
    world.store.fold_counts([world.part])
    return exe.id


def arm(path: str, at: float) -> TimerOp:
    return TimerOp("schedule", path, at)


def cancel(path: str) -> TimerOp:
    return TimerOp("cancel", path)


def kept(world: StuckWorld, *actors: Actor) -> list[Actor]:
    """The start state (and the load hints the actors' loads left) is what holds now."""
    world.keep()
    return list(actors)


# --- the families -------------------------------------------------------------------------


def cancel_and_folds(world: StuckWorld) -> list[Actor]:
    """A week-long timer cancelled on an execution silent for an hour (over the store's own
    load, and over none), while two folders fold: from the cancel on, it waits on nothing
    and is stuck; and one cancelled at exactly the threshold's silence, stuck only past it."""
    x = running(world, "x", arm("w", NOW + WEEK))
    y = running(world, "y", arm("w", NOW + WEEK))
    z = running(world, "z", arm("w", NOW + WEEK), arm("v", NOW + 2 * WEEK))
    return kept(
        world,
        Actor("cancel x", world.timers(x, cancel("w"))),
        Actor("cancel y", world.timers(y, cancel("w"), hint=False, updated_at=NOW - AFTER)),
        Actor("cancel z", world.timers(z, cancel("w"))),
        Actor("fold", world.fold),
    )


def arm_then_cancel(world: StuckWorld) -> list[Actor]:
    """One commit arms a week-long timer, the next (at the version after it) cancels it, and
    a folder and the sweep run beside them."""
    x = running(world, "x")
    return kept(
        world,
        Actor("arm", world.timers(x, arm("w", NOW + WEEK))),
        Actor("cancel", world.timers(x, cancel("w"), version=2)),
        Actor("fold", world.fold),
        Actor("sweep", world.sweep),
    )


def fire_and_cancel(world: StuckWorld) -> list[Actor]:
    """A timer that came due, fired by the sweep while a commit loaded before the firing
    cancels the execution's other timer (its bound is then the fired one's: too low, due,
    so the views read it until the sweep repairs it), with a folder; and an execution whose
    bound a cancel by an older store left due and stale, which the sweep repairs."""
    x = running(world, "x", arm("t", NOW - 100), arm("w", NOW + WEEK))
    y = running(world, "y")
    # stale and due, as a cancel by an older store left it once folded
    world.db[EXES].update_one({"_id": y}, {"$set": {"next_fire": NOW - 50}, "$unset": {QUIET: ""}})
    world.sweeping, world.due = True, frozenset({"t"})
    return kept(
        world,
        Actor("sweep", world.sweep),
        Actor("cancel w", world.timers(x, cancel("w"))),
        Actor("fold", world.fold),
    )


def overdue_and_rearm(world: StuckWorld) -> list[Actor]:
    """A timer overdue past the threshold (stuck) re-armed a week on by a commit (waiting),
    racing the sweep that fires it and a folder."""
    x = running(world, "x", arm("t", NOW - 2 * AFTER))
    world.sweeping, world.due = True, frozenset()
    return kept(
        world,
        Actor("rearm", world.timers(x, arm("t", NOW + WEEK))),
        Actor("sweep", world.sweep),
        Actor("fold", world.fold),
    )
