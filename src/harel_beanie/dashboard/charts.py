"""The front page's charts over the last hour, from a sample the dashboard takes every minute.

Why this module exists, and why samples: an operator wants to see at a glance whether work
is flowing (executions committing, started, finished and failed per minute) and whether
it is falling behind (the age of the oldest pending outbox entry, how late the most overdue
timer is). The store keeps no per-minute history, and reading one from the executions (by
their creation or update times) would scan them. So the dashboard takes one sample a minute
of what `harel_beanie.queries.backlog` already reads (counts by status, the pending work's age,
the timers' lateness) and of the executions that committed in the last minute
(`queries.samples`, a lower bound of the events handled) into a small
collection of its own, `<prefix>_hb_samples`, one document per minute (`_id` = the minute;
several dashboards write the same minute once), expired after a few hours. The charts are the
differences between consecutive samples, drawn server-side as small SVG lines (no script).
A per-minute rate that went down (a prune removed executions, a redrive took one out of
FAILED) is drawn as 0 for that minute.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Optional

from pydantic import BaseModel
from pymongo import ASCENDING, IndexModel
from pymongo.errors import InvalidOperation, PyMongoError

from harel_beanie.queries.samples import FINISHED, MINUTE, latest_sample, samples_name, take_sample
from harel_beanie.queries.server import server_of

__all__ = [
    "FINISHED",
    "MINUTE",
    "SPAN",
    "KEEP_SECONDS",
    "Sampler",
    "charts",
    "latest_sample",
    "samples_name",
    "take_sample",
]

#: the charts' span, in minutes
SPAN = 60
#: how long a sample is kept (the charts read the last hour)
KEEP_SECONDS = 3 * 3600


class Series(BaseModel):
    """One chart: a value per minute, oldest first (None: no sample for that minute)."""

    name: str
    unit: str
    points: list[Optional[float]]

    @property
    def latest(self) -> Optional[float]:
        return next((p for p in reversed(self.points) if p is not None), None)


class ChartsOut(BaseModel):
    minutes: list[float]  # the minutes the points are for (epoch seconds, oldest first)
    series: list[Series]
    samples: int  # samples found in the span


#: seconds the first sample waits after the dashboard's first page: it reads what `status`
#: reads (on the embedded server at a million executions, about a second with 10,000 holding
#: pending work), and a server running one command at a time would make that first page wait
FIRST_AFTER = 5.0


class Sampler:
    """Takes a sample at the start of every minute while the dashboard runs, the first
    `FIRST_AFTER` seconds after it is started."""

    def __init__(self) -> None:
        self._task: Optional[asyncio.Task[None]] = None

    def start(self, doc: Any, samples: Any) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(doc, samples))

    async def _run(self, doc: Any, samples: Any) -> None:
        try:
            await asyncio.sleep(FIRST_AFTER)
            await samples.create_indexes(
                [IndexModel([("at", ASCENDING)], name="hb_sample_ttl", expireAfterSeconds=KEEP_SECONDS)]
            )
            while True:
                try:
                    await take_sample(doc, samples)
                except InvalidOperation:  # the store's client was closed: the dashboard is gone
                    return
                except PyMongoError:  # a sample missed is a gap in a chart: the next minute tries again
                    pass
                await asyncio.sleep(MINUTE - time.time() % MINUTE + 0.5)
        except (InvalidOperation, PyMongoError):
            return


def _rate(values: list[Optional[float]]) -> list[Optional[float]]:
    """Per-minute increases of a running total (None where either minute has no sample)."""
    out: list[Optional[float]] = [None]
    for a, b in zip(values, values[1:]):
        out.append(None if a is None or b is None else max(0.0, b - a))
    return out


async def charts(samples: Any, now: Optional[float] = None, hint: bool = False) -> ChartsOut:
    """The last hour's series, from the samples (one read: a range of `_id`, at most 61
    documents). `hint` names the `_id` index to a server on which that reads less (mongod may
    otherwise plan a range on `_id` alone as a scan of the collection; SecantusDB walks the
    whole index it is named, and not every client takes a hint)."""
    now = time.time() if now is None else now
    last = now - now % MINUTE
    minutes = [last - MINUTE * (SPAN - 1 - i) for i in range(SPAN)]
    span = {"_id": {"$gte": minutes[0] - MINUTE, "$lte": last}}
    named = hint and (await server_of(samples)).hints_help
    docs = await (samples.find(span, hint="_id_") if named else samples.find(span)).to_list(None)
    by_minute = {float(d["_id"]): d for d in docs}

    def column(field: str, extra: float = 0.0) -> list[Optional[float]]:
        return [float(by_minute[m][field]) if m in by_minute else None for m in [minutes[0] - MINUTE, *minutes]]

    series = [
        # not a rate: each sample counts the executions that committed in its minute
        Series(name="executions committing", unit="/min", points=column("active")[1:]),
        Series(name="started", unit="/min", points=_rate(column("executions"))[1:]),
        Series(name="finished", unit="/min", points=_rate(column("finished"))[1:]),
        Series(name="failed", unit="/min", points=_rate(column("failed"))[1:]),
        Series(name="oldest outbox entry", unit="s", points=column("outbox_age")[1:]),
        Series(name="timer lag", unit="s", points=column("timer_lag")[1:]),
    ]
    return ChartsOut(minutes=minutes, series=series, samples=sum(1 for m in minutes if m in by_minute))


def sparkline(series: Series, width: int = 180, height: int = 36) -> dict[str, Any]:
    """What the template draws for one series: the polyline's points and its scale."""
    values = [p for p in series.points if p is not None]
    top = max(values, default=0.0) or 1.0
    step = width / max(len(series.points) - 1, 1)
    points = " ".join(
        f"{i * step:.1f},{height - 2 - (p / top) * (height - 4):.1f}"
        for i, p in enumerate(series.points)
        if p is not None
    )
    return {"points": points, "count": len(values), "top": top, "width": width, "height": height}
