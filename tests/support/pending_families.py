"""The pending figures' schedule family: commits that emit and spawn, a relay that delivers, a
fold and a sampler, run one call at a time in every order up to a bound by the schedule
explorer (tests/support/explore.py) on the real wire server, with the pending figures every
view shows held to the documents after every step, and progress held at the end.

Why this module exists: `queries.backlog` reads the pending outbox entries and spawns through
the `pending` flag's partial index, one aggregation, the oldest-entries walk
(`queries.oldest`) and, in the views, a per-minute sample (`queries.samples`). Each is argued
separately; this family holds them together, as writes land in every order, to the
definition computed apart from them (`tests.support.pending_oracle`):

- after every step, `backlog()` says exactly the documents' counts and oldest ages, and lists
  the holders of the oldest entries the documents say, in their order;
- a sample taken at T is served 30 s later as it was at T (the ages grown by 30 s), and 61 s
  later not at all: the figures are the documents' then (a sample is at most a minute old);
- progress: after the schedule and a settling relay pass (the next worker's) and a fold,
  nothing is pending, every entry ever pending was delivered (an outbox entry handed on, a
  spawn's child created) and the views say so. A relay that never delivers, or a write that
  leaves an entry behind the `pending` flag's back, fails here.

The seqs are minted by the store at the real clock; the views read at the real clock too (and
at a sample's time plus 30 and 61 s), so the ages compared are of the same instant.
"""

from __future__ import annotations

import asyncio
import copy
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import pymongo
from harel.engine.execution import Execution, Status
from harel.engine.store.base import StoreConflict
from harel.spec.states import Event

from harel_beanie import AsyncMongoStore, queries
from harel_beanie.core import flows
from harel_beanie.core.calls import Flow
from harel_beanie.core.commit import CommitRequest
from harel_beanie.core.count_documents import counts_collection
from harel_beanie.core.documents import ExecutionDocument
from harel_beanie.core.seqs import EPOCH_MS
from harel_beanie.queries.samples import sampled_backlog, samples_name, take_sample
from harel_beanie.store.dispatch import call, drive
from harel_beanie.store.sync_store import MongoStore
from tests.support.explore import Actor, Explorer, Report
from tests.support.pending_oracle import KINDS, PendingTruth, differences, pending_truth

#: every id shares this family key, so all are in one partition
FAMILY = "pend"
EXES = "harel_executions"
#: how many holders of each kind the views list in these checks: fewer than hold entries
LISTED = 2
#: how long after a sample the views are read: within its minute, and just past it
WITHIN, PAST = 30.0, 61.0


@dataclass(frozen=True)
class Sample:
    """Not a flow's call: the per-minute sample a worker takes (`take_sample`), whole, as one
    step of a schedule."""

    target: str = "samples"


@dataclass
class PendingWorld:
    """The start state (three executions, one holding an outbox entry already), the actors and
    the checks."""

    url: str
    client: pymongo.MongoClient[Any]
    db_name: str
    saved: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: every entry seen pending in some step of the schedule, and every one delivered
    observed: set[tuple[str, int]] = field(default_factory=set)
    delivered: set[tuple[str, int]] = field(default_factory=set)
    children: set[str] = field(default_factory=set)  # the spawns' children, created by a relay
    spawned: set[str] = field(default_factory=set)  # the children the spawns asked for
    sampled: Optional[tuple[float, PendingTruth]] = None  # when the sample was taken, and the truth then

    def __post_init__(self) -> None:
        self.db = self.client[self.db_name]
        # each store on a client of its own (a store closes its client)
        self.store = MongoStore(pymongo.MongoClient(self.url), self.db_name)  # the committers'
        self.relay_store = MongoStore(pymongo.MongoClient(self.url), self.db_name)  # another worker's: the relay's
        self.loop = asyncio.new_event_loop()
        self.aclient: Any = pymongo.AsyncMongoClient(self.url)
        self.reader = AsyncMongoStore(self.aclient, self.db_name)  # binds the views' documents
        self.samples = self.aclient[self.db_name][samples_name("harel")]

    def setup(self) -> None:
        for s in (self.store, self.relay_store):
            s.init()
        # the flows replay alike in every schedule (the explorer's premise): the committers'
        # seqs minted at one frozen millisecond (carried past it by their counter, inside the
        # lease the first mint takes), no lease renewal coming due mid-run
        frozen = time.time_ns() // 1_000_000 - EPOCH_MS
        self.store._state.mint._clock_ms = lambda: frozen
        self.loop.run_until_complete(self.reader.init())
        self.store.fold_counts()
        for name in ("a", "b", "c"):
            self.store.save(Execution(id=f"{FAMILY}:{name}", definition_id="P", status=Status.RUNNING))
        c = self.store.load(f"{FAMILY}:c")
        assert c is not None
        self.store.commit(c, [(f"{FAMILY}:a", Event(kind="Early"))], Event(kind="Go").id)  # pending already
        self.store.fold_counts()
        self.loaded = {n: self.store.load(f"{FAMILY}:{n}") for n in ("a", "b")}
        counts = counts_collection("harel")
        # the counters collection (the seq leases) is left as it is: the store's mint keeps its lease
        self.saved = {EXES: list(self.db[EXES].find({})), counts: list(self.db[counts].find({}))}

    def reset(self) -> None:
        for name, docs in self.saved.items():
            self.db[name].delete_many({})
            if docs:
                self.db[name].insert_many(copy.deepcopy(docs))
        self.db[samples_name("harel")].delete_many({})
        self.observed, self.delivered, self.children, self.spawned = set(), set(), set(), set()
        self.sampled = None
        for st in (self.store._state, self.relay_store._state):
            st.owners.clear()  # hints a killed relay left: every schedule starts from the same
            st.prefetched = None
        self._observe(list(self.db[EXES].find({})))

    def close(self) -> None:
        self.loop.run_until_complete(self.reader.close())
        self.loop.close()
        for s in (self.store, self.relay_store):
            s.close()

    def execute(self, c: Any) -> Any:
        if isinstance(c, Sample):
            at = time.time()
            self.loop.run_until_complete(take_sample(ExecutionDocument, self.samples, now=at))
            self.sampled = (at, pending_truth(self.db[EXES].find({}), at))
            return None
        return call(self.store._colls, c)

    # --- the actors -----------------------------------------------------------------------

    def commits(self) -> Flow[Any]:
        """a emits two events (one to b) and spawns a child; then b emits one to a."""
        a, b = (copy.deepcopy(self.loaded[n]) for n in ("a", "b"))
        child = (f"{FAMILY}:a:Kid:0", "Kid", {"n": 1})
        emits = [(f"{FAMILY}:b", Event(kind="Ping")), (None, Event(kind="Log"))]
        yield from flows.commit(self.store._state, CommitRequest(a, emits, Event(kind="A").id, spawns=(child,)))
        yield from flows.commit(self.store._state, CommitRequest(b, [(f"{FAMILY}:a", Event(kind="Pong"))]))

    def relay(self) -> Flow[Any]:
        """One relay pass of another worker: both kinds read at once, each spawn's child
        created (one made already is delivered), each entry handed on, then acked."""
        st = self.relay_store._state
        spawns = yield from flows.pending_spawns(st)
        outbox = yield from flows.pending_outbox(st)
        for s in spawns:
            kid = Execution(id=s.child_id, definition_id="Kid", status=Status.RUNNING, parent_id=s.parent_id)
            try:
                yield from flows.commit(st, CommitRequest(kid))
            except StoreConflict:
                pass  # created by an earlier delivery: delivered
            self.delivered.add(("spawn", s.seq))
            self.children.add(s.child_id)
            yield from flows.ack_spawn(st, s.seq)
        for e in outbox:
            self.delivered.add(("outbox", e.seq))  # handed on (the transport's publish)
            yield from flows.ack_outbox(st, e.seq)

    def fold(self) -> Flow[Any]:
        st = self.store._state
        return flows.fold_counts(st.scope, [st.scope.part_of(f"{FAMILY}:a")])

    def sampler(self) -> Flow[Any]:
        yield Sample()

    # --- the checks -----------------------------------------------------------------------

    def _observe(self, docs: list[dict[str, Any]]) -> PendingTruth:
        truth = pending_truth(docs, time.time())
        for d in docs:
            for kind, array in KINDS.items():
                self.observed |= {(kind, e["seq"]) for e in d.get(array) or []}
            self.spawned |= {e["child_id"] for e in d.get("spawns") or []}
        return truth

    def _views(self, now: float) -> Any:
        return self.loop.run_until_complete(queries.backlog(now=now, show=0, timers=0, oldest=LISTED))

    def _sampled(self, now: float) -> Any:
        return self.loop.run_until_complete(
            sampled_backlog(ExecutionDocument, self.samples, now=now, show=0, timers=0, oldest=0)
        )

    def check(self, _steps: Any = None) -> None:
        truth = self._observe(list(self.db[EXES].find({})))
        said = self._views(truth.now)
        problems = differences(said, truth, who="backlog()")
        for kind, rows in (("outbox", said.oldest_outbox), ("spawn", said.oldest_spawns)):
            listed, want = [r["id"] for r in rows], truth.oldest_ids(kind, LISTED)
            if listed != want:
                problems.append(f"backlog() lists {listed} as holding the oldest {kind} entries, the documents {want}")
        if self.sampled is not None:
            at, then = self.sampled
            problems += differences(
                self._sampled(at + WITHIN), then.at(at + WITHIN), who="a sample 30 s old", slack=5e-3
            )
            problems += differences(self._sampled(at + PAST), truth.at(at + PAST), who="61 s after a sample")
        assert not problems, "the pending figures differ from the documents': " + "; ".join(problems)

    def settle(self) -> None:
        """The next worker's relay pass and fold, then progress: nothing pending, every entry
        ever pending delivered, every spawn's child created, and the views saying so."""
        drive(self.relay(), self.execute)
        drive(self.fold(), self.execute)
        docs = list(self.db[EXES].find({}))
        left = [d["_id"] for d in docs if d.get("outbox") or d.get("spawns") or "pending" in d]
        assert not left, f"progress: entries (or the pending flag) left after a settling relay pass on {left}"
        missing = sorted(self.observed - self.delivered)
        assert not missing, f"progress: entries pending once and never delivered: {missing}"
        unborn = sorted(self.spawned - {d["_id"] for d in docs})
        assert not unborn, f"progress: spawned children never created: {unborn}"
        self.check()

    def explore(self, actors: list[Actor], **bounds: Any) -> Report:
        report = Explorer(actors, self.reset, self.execute, self.check, self.settle, **bounds).run()
        print(
            f"explored {report.schedules} schedules ({'all' if report.exhausted else 'bounded'}), sampled {report.sampled}"
        )
        return report


def commits_relay_fold_and_sample(world: PendingWorld) -> list[Actor]:
    """Commits that emit and spawn, a relay delivering, a fold and a sampler, racing."""
    return [
        Actor("commits", world.commits),
        Actor("relay", world.relay),
        Actor("fold", world.fold),
        Actor("sampler", world.sampler),
    ]
