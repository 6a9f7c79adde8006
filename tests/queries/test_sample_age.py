"""A sample is served only while at most a minute old by the reader's clock, and never from a
clock ahead (`queries.samples.latest_sample`'s rule); `/metrics` says how old the sample its
pending figures came from is, NaN when it read them itself.

The ages are chosen so the read's `_id` range (this minute's sample and the last) reaches the
sample: a sample taken one second into a minute is 61 s old one second into the next, which
that range still holds, so only the age bound can refuse it. A probe at 120 s could not tell a
minute's bound from an hour's: the range never reaches it.
"""

from __future__ import annotations

import math
import time
from typing import Any

from harel.engine.execution import Execution, Status
from harel.spec.states import Event

from harel_beanie import AsyncMongoStore
from harel_beanie.core.documents import bind
from harel_beanie.queries.samples import MINUTE, latest_sample, sampled_backlog, samples_name, take_sample
from harel_beanie.telemetry.metrics import StoreMetrics, new_registry


def _collections(store: AsyncMongoStore) -> tuple[Any, Any]:
    doc = bind(store.settings.prefix)[0]
    return doc, doc.get_pymongo_collection().database[samples_name(store.settings.prefix)]


async def _one_pending(astore: AsyncMongoStore, now: float) -> None:
    busy = Execution(id="busy", definition_id="Order", status=Status.RUNNING, updated_at=now)
    await astore.commit(busy, [("busy", Event(kind="Ping"))])


async def test_a_sample_is_served_up_to_60_s_and_refused_at_61(astore: AsyncMongoStore) -> None:
    await astore.init()
    doc, samples = _collections(astore)
    minute = time.time() // MINUTE * MINUTE - 10 * MINUTE
    taken = minute + 1.0  # one second into its minute
    await _one_pending(astore, taken)
    await take_sample(doc, samples, now=taken)
    assert (await latest_sample(samples, now=taken + 60.0)) is not None  # a minute old: "at most a minute"
    assert (await latest_sample(samples, now=taken + 61.0)) is None  # 61 s: refused, though its _id is read
    # the views agree: at 61 s the pending entries are read from the documents, not the sample
    b = await sampled_backlog(doc, samples, now=taken + 61.0, show=0)
    assert b.entries_at == taken + 61.0 and b.pending_outbox == 1


async def test_a_sample_from_a_clock_ahead_is_not_served(astore: AsyncMongoStore) -> None:
    await astore.init()
    doc, samples = _collections(astore)
    minute = time.time() // MINUTE * MINUTE - 10 * MINUTE
    reader = minute + 10.0
    await take_sample(doc, samples, now=reader + 5.0)  # a writer whose clock runs 5 s ahead
    assert (await latest_sample(samples, now=reader)) is None
    assert (await latest_sample(samples, now=reader + 5.0)) is not None  # once the reader's clock is there


async def test_metrics_export_the_age_of_the_sample_they_served(astore: AsyncMongoStore) -> None:
    await astore.init()
    doc, samples = _collections(astore)
    now = time.time()
    await _one_pending(astore, now)
    metrics = StoreMetrics(new_registry())
    await metrics.refresh(doc=doc, now=now, sampled=None)
    assert math.isnan(metrics.sample_age._value.get())  # read at the scrape: no sample's age
    assert b"harel_pending_sample_age_seconds NaN" in metrics.render()
    await take_sample(doc, samples, now=now)
    kept = await latest_sample(samples, now=now + 42.0)
    assert kept is not None
    await metrics.refresh(doc=doc, now=now + 42.0, sampled=kept)
    assert abs(metrics.sample_age._value.get() - 42.0) < 0.01
