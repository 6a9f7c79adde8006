"""The front page's charts from the samples a dashboard takes of a real store (the browser test
draws samples it writes itself; here the samples are the dashboard's own):

- a sample holds what `status` reads: executions, finished and failed, the oldest pending
  outbox entry's age, the most overdue timer's lateness; and the executions whose latest
  commit fell in the minute before it (`active`, each once); a second dashboard taking the
  same minute changes nothing;
- the charts are the differences between consecutive minutes: executions started, finished
  and failed per minute; the levels as sampled (executions committing among them); a minute
  with no sample is a gap, and a total that went down (a prune) is drawn as 0;
- a running dashboard's sampler makes the samples' expiry index and takes this minute's sample;
- `/metrics` serves the pending entries from a sample at most a minute old, reading none.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Any

import pymongo
from harel.engine.execution import Execution, Status
from harel.engine.store.base import TimerOp
from harel.spec.states import Event
from pymongo import monitoring

from harel_beanie import AsyncMongoStore
from harel_beanie.core.documents import bind
from harel_beanie.dashboard.charts import (
    KEEP_SECONDS,
    SPAN,
    Sampler,
    charts,
    latest_sample,
    samples_name,
    take_sample,
)
from harel_beanie.telemetry.metrics import StoreMetrics, new_registry


def _collections(store: AsyncMongoStore) -> tuple[Any, Any]:
    doc = bind(store.settings.prefix)[0]
    return doc, doc.get_pymongo_collection().database[samples_name(store.settings.prefix)]


async def test_the_charts_are_the_minutes_differences_of_the_samples(astore: AsyncMongoStore) -> None:
    await astore.init()
    doc, samples = _collections(astore)
    now = time.time()
    m0 = now - now % 60 - 300  # five minutes ago
    for i in range(4):  # committed in the minute before the first sample
        await astore.save(Execution(id=f"a-{i}", definition_id="Order", status=Status.RUNNING, updated_at=m0 - 10))
    await astore.save(Execution(id="old", definition_id="Order", status=Status.DONE, updated_at=m0 - 3600))
    await take_sample(doc, samples, now=m0 + 1)
    first = await samples.find_one({"_id": m0})
    assert first is not None and (first["executions"], first["active"], first["failed"]) == (5, 4, 0)

    # the next minute: two finish, one fails (one of them twice), two more start, and a
    # timer is 30 s overdue on one that commits nothing else in the minute
    for i, status in ((0, Status.DONE), (1, Status.CANCELLED), (2, Status.FAILED), (2, Status.FAILED)):
        exe = await astore.load(f"a-{i}")
        assert exe is not None
        await astore.save(exe.model_copy(update={"status": status, "updated_at": m0 + 30}))
    for i in (4, 5):
        await astore.save(Execution(id=f"a-{i}", definition_id="Order", status=Status.RUNNING, updated_at=m0 + 40))
    late = await astore.load("a-3")
    assert late is not None
    await astore.commit(late, [], None, (TimerOp("schedule", "Wait", m0 + 60 - 30),))  # still at m0 - 10
    await take_sample(doc, samples, now=m0 + 61)
    await take_sample(doc, samples, now=m0 + 62)  # another dashboard, the same minute: kept as it was
    kept = await samples.find_one({"_id": m0 + 60})
    assert kept["at"].replace(tzinfo=datetime.timezone.utc).timestamp() == m0 + 61

    drawn = await charts(samples, now=m0 + 61, hint=True)
    assert len(drawn.minutes) == SPAN and drawn.minutes[-1] == m0 + 60 and drawn.samples == 2
    last = {s.name: s.points[-1] for s in drawn.series}
    assert last == {
        "executions committing": 5.0,  # a-0, a-1, a-2 (twice, counted once), a-4, a-5
        "started": 2.0,
        "finished": 2.0,
        "failed": 1.0,
        "oldest outbox entry": 0.0,
        "timer lag": 31.0,
    }
    before = {s.name: s.points[-2] for s in drawn.series}
    assert before["started"] is None and before["timer lag"] == 0.0  # no sample before m0: no rate
    assert before["executions committing"] == 4.0  # a level, not a rate: m0's own
    assert all(p is None for s in drawn.series for p in s.points[:-2])  # minutes never sampled: gaps

    # a total that went down (executions removed by a prune) is drawn as 0, not negative
    await samples.insert_one({"_id": m0 + 120, **{k: v for k, v in first.items() if k != "_id"}})
    drawn = await charts(samples, now=m0 + 121, hint=True)
    assert {s.name: s.points[-1] for s in drawn.series}["started"] == 0.0


async def test_a_running_dashboards_sampler_keeps_the_samples(astore: AsyncMongoStore) -> None:
    await astore.init()
    doc, samples = _collections(astore)
    await astore.save(Execution(id="s-1", definition_id="Order", status=Status.RUNNING, updated_at=time.time()))
    sampler = Sampler()
    sampler.start(doc, samples)
    try:
        for _ in range(200):  # bounded: 20 s
            indexes = await samples.index_information()
            if "hb_sample_ttl" in indexes and await samples.count_documents({}) >= 1:
                break
            await asyncio.sleep(0.1)
        assert indexes["hb_sample_ttl"]["expireAfterSeconds"] == KEEP_SECONDS
        sample = await samples.find_one({})
        now = time.time()
        assert sample["_id"] in (now - now % 60, now - now % 60 - 60) and sample["executions"] == 1
    finally:
        assert sampler._task is not None
        sampler._task.cancel()


class _PendingReads(monitoring.CommandListener):
    """The reads of the documents holding pending entries (an aggregate led by `pending`)."""

    def __init__(self) -> None:
        self.n = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "aggregate" and "pending" in (
            (event.command.get("pipeline") or [{}])[0].get("$match") or {}
        ):
            self.n += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def test_metrics_serve_the_pending_entries_from_a_sample_at_most_a_minute_old(
    mongo_url: str, db_name: str
) -> None:
    """A scrape read every document holding a pending entry (10,000 at a million seeded
    executions): with a sample the dashboard took at most a minute ago, it reads none, and
    serves the sample's figures, the oldest entry's age grown by the sample's age."""
    watched = _PendingReads()
    astore = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url, event_listeners=[watched]), db_name)
    await astore.init()
    doc, samples = _collections(astore)
    now = time.time()
    busy = Execution(id="busy", definition_id="Order", status=Status.RUNNING, updated_at=now)
    await astore.commit(busy, [("busy", Event(kind="Ping"))], spawns=(("busy:X:0", "X", {}),))
    metrics = StoreMetrics(new_registry())
    assert await latest_sample(samples, now=now) is None
    watched.n = 0
    await metrics.refresh(doc=doc, now=now, sampled=None)  # no sample: read at the scrape
    assert watched.n == 1 and metrics.pending.labels("outbox")._value.get() == 1
    await take_sample(doc, samples, now=now)
    kept = await latest_sample(samples, now=now + 30)
    assert kept is not None and (kept["pending_outbox"], kept["pending_spawns"]) == (1, 1)
    watched.n = 0
    await metrics.refresh(doc=doc, now=now + 30, sampled=kept)
    assert watched.n == 0  # served from the sample
    assert metrics.pending.labels("outbox")._value.get() == 1 and metrics.pending.labels("spawn")._value.get() == 1
    assert metrics.oldest_pending.labels("outbox")._value.get() >= 30  # its age, 30 s on
    assert await latest_sample(samples, now=now + 120) is None  # older than a minute: read again
    await astore.close()
