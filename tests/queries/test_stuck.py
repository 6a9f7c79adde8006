"""Stuck means stuck (`harel_beanie.core.stuck`): an execution waiting on a timer ahead, or on
pending work a relay will deliver, is not listed; one silent with nothing to wake it, one
whose timer is long overdue, and one written since the counts' last fold are. And what the
backlog (`status`, `/backlog`), the failed page and `/metrics` read stays the same as
executions waiting on a timer days ahead are added: at a million executions, 80,000 of them
were read on every scrape, page and `status` (10 to 18 s each on the embedded server).

The documents each view reads are counted on the wire as the other structural tests count
them: every filter it sends to the executions (a find's, an aggregate's first `$match`),
counted again with a count of its own, is what SecantusDB reads for it."""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import pymongo
import pytest
from harel.engine.execution import Execution, Status
from harel.engine.store.base import TimerOp
from harel.spec.states import Event
from pymongo import monitoring

from harel_beanie import AsyncMongoStore, MongoStore, queries
from harel_beanie.commands import status as status_command
from harel_beanie.core import calls, flows
from harel_beanie.core.counting import COUNTED, DIRTY
from harel_beanie.core.documents import ExecutionDocument
from harel_beanie.core.flows.counting import build
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, part_of
from harel_beanie.core.seqs import MS_SHIFT
from harel_beanie.core.stuck import QUIET, is_stuck, quiet_of
from harel_beanie.dashboard import views
from harel_beanie.deploy import stack
from harel_beanie.deploy.where import RetryPolicy, Target
from harel_beanie.queries import lowest as lowest_module
from harel_beanie.queries.samples import latest_sample, take_sample
from harel_beanie.queries.single import stuck_filter
from harel_beanie.store.dispatch import FlowRun, call
from harel_beanie.telemetry.metrics import StoreMetrics, new_registry
from tests.store.test_structure import _idle_documents

AFTER = 300.0
DAY = 86_400.0
SIZES = (50, 2_000)  # executions waiting on a timer days ahead


def test_the_definition() -> None:
    now = 1_800_000_000.0
    old = now - 3600
    running = {"status": "RUNNING", "updated_at": old}
    assert is_stuck(running, after=AFTER, now=now)  # silent, nothing to wake it
    assert not is_stuck({**running, "updated_at": now - 10}, after=AFTER, now=now)  # not silent long
    assert not is_stuck({**running, "timers": {"a": now + 5 * DAY}, "next_fire": now + 5 * DAY}, after=AFTER, now=now)
    assert not is_stuck({**running, "timers": {"a": now - 10}}, after=AFTER, now=now)  # due: the sweep's
    assert is_stuck({**running, "timers": {"a": now - 2 * AFTER}}, after=AFTER, now=now)  # long overdue
    # a stale bound (its timer cancelled) is no timer
    assert is_stuck({**running, "timers": {}, "next_fire": now - 2 * AFTER}, after=AFTER, now=now)
    assert not is_stuck({**running, "pending": True}, after=AFTER, now=now)  # a relay's to deliver
    assert not is_stuck({**running, "status": "DONE"}, after=AFTER, now=now)
    assert quiet_of(running) == old
    assert quiet_of({**running, "next_fire": now}) is None and quiet_of({**running, "pending": True}) is None
    assert quiet_of({**running, "status": "FAILED"}) is None and quiet_of({"status": "RUNNING"}) is None


class _Reads(monitoring.CommandListener):
    """The filter of every read sent to the executions."""

    def __init__(self) -> None:
        self.filters: list[dict[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        cmd = event.command
        if event.command_name == "find" and cmd["find"] == "harel_executions":
            self.filters.append(dict(cmd.get("filter") or {}))
        elif event.command_name == "aggregate" and cmd["aggregate"] == "harel_executions":
            first = (cmd.get("pipeline") or [{}])[0]
            self.filters.append(dict(first.get("$match") or {}))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def _waiting(start: int, stop: int, now: float, entry: Optional[dict[str, Any]] = None) -> list[dict[str, Any]]:
    """Executions waiting on a timer 1 to 30 days ahead, last updated up to 30 days ago, as
    the store and a fold leave them (counted, no dirty mark, no `quiet`: a timer is armed);
    with `entry`, one in ten also holds such an outbox entry, not relayed yet (a backlog),
    each minted a millisecond before the next, as one store instance mints them."""
    docs = _idle_documents(start, stop, now)
    for i, d in enumerate(docs):
        d["_id"] = f"w{start + i:06d}"
        d["part"] = part_of(d["_id"], DEFAULT_PARTITIONS)
        d.pop("parent_id", None)
        spread = (start + i) * 0.618_033_988_75 % 1  # evenly, in no order
        fire = now + DAY * (1 + 29 * spread)
        d["timers"], d["next_fire"] = {"Wait": fire}, fire
        d["updated_at"] = now - DAY * 30 * (1 - spread) - 3600
        d.pop(DIRTY, None)
        d[COUNTED] = {"d": d["definition_id"], "s": "RUNNING", "v": d.get("version", 0)}
        if entry is not None and (start + i) % 10 == 0:
            d["outbox"], d["pending"] = [{**entry, "seq": entry["seq"] - ((start + i + 1) << MS_SHIFT)}], True
    return docs


def _run(store: MongoStore, eid: str, *, emits: int = 0, timer: float | None = None) -> None:
    at = time.time()  # harel's runner stamps these
    exe = Execution(id=eid, definition_id="Shop", status=Status.RUNNING, active_path="A", created_at=at, updated_at=at)
    store.commit(exe, [])
    timers = (TimerOp("schedule", "A", timer),) if timer is not None else ()
    exe = exe.model_copy(update={"version": 1, "updated_at": time.time()})
    store.commit(exe, [(eid, Event(kind="Ping"))] * emits, Event(kind="Go").id, timers)


@pytest.mark.skipif(bool(os.environ.get("MONGODB_URL")), reason="a limited read is bounded on mongod anyway")
async def test_waiting_is_not_stuck_and_the_views_read_the_same_however_many_wait(
    mongo_url: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lowest_module, "_START", {})
    monkeypatch.setattr(lowest_module, "_KEPT", {})
    reads = _Reads()
    aclient: Any = pymongo.AsyncMongoClient(mongo_url, event_listeners=[reads])
    astore = AsyncMongoStore(aclient, db_name)
    await astore.init()
    store = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    coll = pymongo.MongoClient(mongo_url)[db_name].harel_executions
    real = time.time()
    now = real + 3600  # the views look an hour on: what was committed above is silent since
    _run(store, "quiet")  # nothing to wake it
    _run(store, "overdue", timer=real - 1000)  # a timer the sweep never fired
    _run(store, "relayed", emits=1)  # its event relayed below: then nothing to wake it
    _run(store, "relaying", emits=1)  # an event not relayed yet: a relay's to deliver
    _run(store, "soon", timer=real + DAY)  # a timer ahead
    store.fold_counts()
    [entry] = [e for e in store.pending_outbox() if e.target_id == "relayed"]
    store.ack_outbox(entry.seq)  # the ack marks it for the fold: it may wait on nothing now
    _run(store, "unfolded")  # written since the last fold: no `quiet` yet
    assert coll.find_one({"_id": "quiet"})[QUIET] is not None and QUIET not in coll.find_one({"_id": "soon"})
    # executions the counters never counted (harel's, migrated): their build gives `quiet`
    adopted = _waiting(900_000, 900_002, now)
    for d, fire in zip(adopted, (None, now + DAY)):
        d["_id"] = f"adopted-{'quiet' if fire is None else 'waiting'}"
        d["part"] = part_of(d["_id"], DEFAULT_PARTITIONS)
        d["timers"], d["next_fire"] = ({}, None) if fire is None else ({"Wait": fire}, fire)
        if fire is None:
            del d["next_fire"]
        del d[COUNTED]
    coll.insert_many(adopted)
    pymongo.MongoClient(mongo_url)[db_name].harel_hb_counts.delete_many({})
    # built again as a worker or `migrate up` builds them (a read builds nothing), with no fold:
    # "unfolded" stays as written
    store._run(build(range(DEFAULT_PARTITIONS)))
    want = ["adopted-quiet", "overdue", "quiet", "relayed", "unfolded"]
    metrics = StoreMetrics(new_registry())
    samples = aclient[db_name]["harel_hb_samples"]
    entry = dict(coll.find_one({"_id": "relaying"})["outbox"][0])
    target = Target(url=mongo_url, db=db_name, prefix="harel", retry=RetryPolicy(1, 0.1, 5_000), source="--url")
    # `status` opens its own client: its reads are counted too
    # (it imports `open_client` from the stack as it runs: the stack's is the one to replace)
    opened = stack.open_client
    monkeypatch.setattr(stack, "open_client", lambda t: opened(t, listeners=[reads]))

    async def sampled() -> None:
        """This minute's sample, as a running worker or dashboard takes it once a minute: at
        the views' clock an hour on, and at the real one (the dashboard's pages and `status`)."""
        await samples.delete_many({})
        for at in (now, time.time()):
            await take_sample(ExecutionDocument, samples, now=at)

    async def views_read() -> dict[str, int]:
        """Each view once, and the documents its reads' filters match."""
        out = {}
        jobs = {
            "backlog()": lambda: queries.backlog(stuck_after=AFTER, now=now, show=20, entries=False),
            "/backlog": lambda: views.backlog_view(stuck_after=AFTER, show=20, doc=ExecutionDocument, samples=samples),
            "/failed": lambda: views.failed_view(after=None, limit=50, stuck_after=AFTER, doc=ExecutionDocument),
            "/metrics": lambda: metrics_refresh(),
            # last: its store binds the documents to its own client, closed when it is done
            "status": lambda: status_command.collect(target, AFTER, 20),
        }
        for name, job in jobs.items():
            reads.filters.clear()
            await job()
            out[name] = sum(coll.count_documents(f) for f in reads.filters)
        await AsyncMongoStore(aclient, db_name).init()  # the documents bound to this client again
        return out

    async def metrics_refresh() -> Any:
        return await metrics.refresh(stuck_after=AFTER, now=now, sampled=await latest_sample(samples, now=now))

    work = {}
    made = 0
    for n in SIZES:
        coll.insert_many(_waiting(made, n, now, entry))
        made = n
        await sampled()
        b = await queries.backlog(stuck_after=AFTER, now=now, show=20)  # a process's first reads
        assert sorted(s["id"] for s in b.stuck) == want, b.stuck
        assert QUIET in coll.find_one({"_id": "adopted-quiet"}) and QUIET not in coll.find_one(
            {"_id": "adopted-waiting"}
        )
        for _ in range(3):  # the windows are sized from the last read's: 40 times as many now
            await views_read()
        work[n] = await views_read()
        # the read the stuck list was matched every one of them
        assert coll.count_documents(stuck_filter(AFTER, now=now)) >= n
        # and the views show every pending entry, from the sample
        shown = await status_command.collect(target, AFTER, 20)
        await AsyncMongoStore(aclient, db_name).init()
        assert shown["pending_outbox"] == 1 + n // 10 and shown["entries_at"] is not None, shown
    # /failed looks at the real clock: an hour earlier, only the overdue timer and the adopted one
    # (silent since a day before its last update) are stuck
    failed = await views.failed_view(after=None, limit=50, stuck_after=AFTER, doc=ExecutionDocument)
    assert sorted(s.id for s in failed.silent) == ["adopted-quiet", "overdue"]
    assert metrics.stuck._value.get() == len(want)
    await astore.close()
    store.close()
    small, large = work[SIZES[0]], work[SIZES[-1]]
    # 40 times the executions waiting: about the same reads (the next timers' list reads
    # about the 20 it shows, out of 50 or of 2,000; the rest reads only candidates)
    for view in small:
        assert large[view] <= small[view] + 10 and large[view] <= 60, work


def test_an_ack_between_a_folds_read_and_its_mark_leaves_the_execution_to_the_next_fold(
    store: MongoStore, client: Any, db_name: str
) -> None:
    """The fold reads a document holding an entry (not quiet), a relay acks the entry, then
    the fold marks the document: the mark must not clear the dirty mark on the strength of
    what it read (the execution would never be listed as stuck), so it leaves it for the
    next fold, which gives it its `quiet`."""
    coll = client[db_name].harel_executions
    store.init()
    store.fold_counts()  # the counters built, empty
    _run(store, "a", emits=1)
    run = FlowRun(flows.fold_counts(store.partitions))
    acked = False
    while (c := run.next_call()) is not None:
        # the fold's marks: its batch's bulk write of them (or one at a time where it missed)
        if isinstance(c, (calls.UpdateOne, calls.BulkWrite)) and c.target == "executions" and not acked:
            [entry] = store.pending_outbox()
            store.ack_outbox(entry.seq)  # between the fold's read and its mark
            acked = True
        run.reply(call(store._colls, c))
    assert acked, "the fold never reached its marks"
    doc = coll.find_one({"_id": "a"})
    assert doc.get(DIRTY) is True and QUIET not in doc  # left for the next fold
    store.fold_counts()
    doc = coll.find_one({"_id": "a"})
    assert DIRTY not in doc and doc[QUIET] == doc["updated_at"]
    # and every folded document carries `quiet` exactly when it waits on nothing
    _run(store, "b", timer=time.time() + DAY)
    _run(store, "c")
    store.fold_counts()
    for d in coll.find({}):
        assert (QUIET in d) == (quiet_of(d) is not None), d["_id"]
