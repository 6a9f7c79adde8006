"""One sample of the store a minute: the dashboard's charts' raw material, and the pending
entries every view shows.

Why this module exists: the dashboard's charts (`harel_beanie.dashboard.charts`) draw the
differences between per-minute samples of what `backlog` reads, kept in
`<prefix>_hb_samples`. Three things take them: the dashboard and every worker, each minute
while they run (a minute already sampled is not sampled again), and the demo, at the minutes
of its simulated clock, so the charts show a run that has just ended (the demo plays its
last hour in seconds). Each writes a minute once (`$setOnInsert`).

The pending outbox entries and spawns (how many, the oldest's age) are the one figure of the
backlog that reads every document holding one: at a million executions, 10,000 of them. So
`/metrics`, the backlog page and `harel-beanie status` take them from the newest sample while
it is at most a minute old (`sampled_backlog`), and say when it was taken; only without one
(no dashboard or worker running) does the view read them itself.

The activity figure (`active`, the chart "executions committing") is not a running total of
commits: the counts no longer follow every commit (`core.counting`, Rule 2), so no stored sum
of versions is kept exact for free. A sample counts instead the executions whose latest
commit fell in the minute before it was taken (`updated_at`), each once however many events
it handled in that minute: an equality on each status beside a range on `updated_at`, the
shape `hb_status_updated` serves, so it reads what committed in the minute, not what is
stored (tests/dashboard/test_dashboard_charts.py). It is a lower bound of the events handled.
"""

from __future__ import annotations

import datetime
import time
from typing import Any, Mapping, Optional

from harel.engine.execution import Status

from harel_beanie.queries.backlog import Backlog, backlog

MINUTE = 60.0
FINISHED = ("DONE", "CANCELLED")


def samples_name(prefix: str) -> str:
    return f"{prefix}_hb_samples"


async def take_sample(doc: Any, samples: Any, now: Optional[float] = None, through: Optional[float] = None) -> None:
    """This minute's sample, unless another dashboard (or the demo) took it already; with
    `through`, the same sample for every minute after it up to `through`'s, each written once
    (the demo's clock jumps over minutes in which nothing happens: their samples are this one)."""
    now = time.time() if now is None else now
    # the counts, the pending work's age and the soonest timer: no stuck list, one timer,
    # no list of the executions holding the oldest entries (a view reads it live)
    b = await backlog(doc=doc, now=now, show=0, timers=1, oldest=0)
    totals: dict[str, int] = {}
    for per in b.counts.values():
        for status, n in per.items():
            totals[status] = totals.get(status, 0) + n
    late = [now - t["fire_at"] for t in b.next_timers if t["fire_at"] <= now]
    minute = now - now % MINUTE
    sample = {
        "at": datetime.datetime.fromtimestamp(now, datetime.timezone.utc),
        "executions": sum(totals.values()) + b.purged,
        "active": await committed_within(doc, now - MINUTE, now),
        "finished": sum(totals.get(s, 0) for s in FINISHED),
        "failed": totals.get("FAILED", 0),
        "outbox_age": b.oldest_outbox_age or 0.0,
        "timer_lag": max(late, default=0.0),
        # what `/metrics` serves from the newest sample instead of reading every document
        # holding a pending entry on each scrape (`latest_sample`)
        "pending_outbox": b.pending_outbox,
        "pending_spawns": b.pending_spawns,
        "spawn_age": b.oldest_spawn_age or 0.0,
    }
    last = minute if through is None else max(minute, through - through % MINUTE)
    while minute <= last:
        await samples.update_one({"_id": minute}, {"$setOnInsert": sample}, upsert=True)
        minute += MINUTE
        sample = {**sample, "active": 0}  # the minutes jumped over: nothing committed in them


async def committed_within(doc: Any, since: float, until: float) -> int:
    """The executions whose latest commit fell in [since, until): one count per status, an
    equality and a range, served by `hb_status_updated` (see the module)."""
    coll = doc.get_pymongo_collection()
    window = {"$gte": since, "$lt": until}
    return sum([await coll.count_documents({"status": s.value, "updated_at": window}) for s in Status])


async def latest_sample(samples: Any, now: Optional[float] = None, within: float = MINUTE) -> Optional[dict[str, Any]]:
    """The newest sample if it was taken at most `within` seconds ago by the reader's clock
    (the sampler takes one a minute), with when it was (`taken`, epoch seconds), else None:
    what `/metrics` serves the pending entries from. One read of at most two documents (this
    minute's and the last, by `_id`).

    Rule: a sample is served only while `0 <= now - taken <= within`. The docs promise "at
    most a minute old", so the bound is the minute itself, with no grace; and a sample whose
    time is ahead of the reader's clock (another machine's clock runs fast) has an age this
    reader cannot know, so it is not served either: the view reads the documents instead,
    which is only slower (tests/queries/test_sample_age.py)."""
    now = time.time() if now is None else now
    minute = now - now % MINUTE
    docs = await samples.find({"_id": {"$gte": minute - MINUTE, "$lte": minute}}).to_list(None)
    if not docs:
        return None
    newest = max(docs, key=lambda d: float(d["_id"]))
    at = newest.get("at")
    taken = at.replace(tzinfo=datetime.timezone.utc).timestamp() if isinstance(at, datetime.datetime) else None
    if taken is None or not now - within <= taken <= now or "pending_outbox" not in newest:
        return None  # too old, from a clock ahead of ours, or from a release that did not keep these
    return {**newest, "taken": taken}


def use_sample(b: Backlog, sample: Mapping[str, Any]) -> None:
    """The pending entries' figures of `b` from `sample` (one `latest_sample` returned): its
    counts as they were, its ages grown by the time since it was taken."""
    taken = float(sample.get("taken") or b.now)
    since = max(0.0, b.now - taken)  # an age read a while ago is that much older now
    b.pending_outbox = int(sample.get("pending_outbox") or 0)
    b.pending_spawns = int(sample.get("pending_spawns") or 0)
    b.oldest_outbox_age = float(sample.get("outbox_age") or 0.0) + since if b.pending_outbox else None
    b.oldest_spawn_age = float(sample.get("spawn_age") or 0.0) + since if b.pending_spawns else None
    b.entries_at = taken


async def sampled_backlog(doc: Any, samples: Any, **options: Any) -> Backlog:
    """`backlog(doc=doc, **options)` with the pending entries from the newest sample in
    `samples` when it is at most a minute old (see the module), else read now. One more read
    of at most two samples."""
    now = options.get("now")
    sample = await latest_sample(samples, now=now)
    b = await backlog(doc=doc, **options, entries=sample is None)
    if sample is not None:
        use_sample(b, sample)
    return b


async def sample_if_due(doc: Any, samples: Any, now: Optional[float] = None) -> bool:
    """This minute's sample unless one is kept already (another worker or a dashboard took
    it): what a worker calls after each relay sweep, so the views have a fresh one whenever
    the stack runs. One read of one sample's `_id` when there is nothing to do. Whether it
    took one."""
    now = time.time() if now is None else now
    minute = now - now % MINUTE
    if await samples.find_one({"_id": minute}, {"_id": 1}) is not None:
        return False
    await take_sample(doc, samples, now=now)
    return True
