"""One sample of the store a minute, the dashboard's charts' raw material.

Why this module exists: the dashboard's charts (`harel_beanie.dashboard.charts`) draw the
differences between per-minute samples of what `backlog` reads, kept in
`<prefix>_hb_samples`. Two things take them: the dashboard, every minute while it runs, and the
demo, at the minutes of its simulated clock, so the charts show a run that has just ended
(the demo plays its last hour in seconds). Both write a minute once (`$setOnInsert`).
"""

from __future__ import annotations

import datetime
import time
from typing import Any, Optional

from harel_beanie.queries.backlog import backlog

MINUTE = 60.0
FINISHED = ("DONE", "CANCELLED")


def samples_name(prefix: str) -> str:
    return f"{prefix}_hb_samples"


async def take_sample(doc: Any, samples: Any, now: Optional[float] = None, through: Optional[float] = None) -> None:
    """This minute's sample, unless another dashboard (or the demo) took it already; with
    `through`, the same sample for every minute after it up to `through`'s, each written once
    (the demo's clock jumps over minutes in which nothing happens: their samples are this one)."""
    now = time.time() if now is None else now
    b = await backlog(doc=doc, now=now, show=200)
    totals: dict[str, int] = {}
    for per in b.counts.values():
        for status, n in per.items():
            totals[status] = totals.get(status, 0) + n
    late = [now - t["fire_at"] for t in b.next_timers if t["fire_at"] <= now]
    minute = now - now % MINUTE
    sample = {
        "at": datetime.datetime.fromtimestamp(now, datetime.timezone.utc),
        "executions": sum(totals.values()) + b.purged,
        "commits": b.commits,
        "finished": sum(totals.get(s, 0) for s in FINISHED),
        "failed": totals.get("FAILED", 0),
        "outbox_age": b.oldest_outbox_age or 0.0,
        "timer_lag": max(late, default=0.0),
    }
    last = minute if through is None else max(minute, through - through % MINUTE)
    while minute <= last:
        await samples.update_one({"_id": minute}, {"$setOnInsert": sample}, upsert=True)
        minute += MINUTE
