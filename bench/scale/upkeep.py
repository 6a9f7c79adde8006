"""The scale benchmark's upkeep measurements: prune's throughput at the start and at the end
of a bounded run (executions removed per second over its first and its last batches), and
`migrate up` (the Migrator the command runs) of executions harel's MongoStore wrote, with
its rate at the start and the end of the pass."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import pymongo

from bench.scale.seed import EXECUTIONS, Cloner, grow
from harel_beanie.migrate.engine import Migrator
from harel_beanie.retention import prune

EDGE = 3  # batches at each end of a run that a start or end rate is taken over
WEEK = 7 * 86_400.0


@dataclass
class Rates:
    """A bounded run, batch by batch: (seconds since the start, executions done) after each."""

    marks: list[tuple[float, int]] = field(default_factory=list)
    stopped: bool = False  # ended at its bound, not by running out of work

    def rate(self, first: bool) -> Optional[float]:
        """Executions/s over the first (or last) EDGE batches."""
        marks = [(0.0, 0), *self.marks]
        if len(marks) < 2:
            return None
        edge = min(EDGE, len(marks) - 1)
        (t0, n0), (t1, n1) = (marks[0], marks[edge]) if first else (marks[-1 - edge], marks[-1])
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    def third_rate(self, first: bool) -> Optional[float]:
        """Executions/s over the batches that did the first (or last) third of the run's
        executions. By executions, not batches: a prune batch may remove none (the children
        of a parent still running, looked at again by every run) and take no time, or a few
        and take a window's read, so a rate over a count of batches mixes those with full
        ones."""
        marks = [(0.0, 0), *self.marks]
        total = self.done
        if total <= 0:
            return None
        if first:
            t, n = next((t, n) for t, n in marks if n >= total / 3)
            return n / t if t > 0 else None
        t, n = [(t, n) for t, n in marks if n <= total * 2 / 3][-1]
        return (total - n) / (self.seconds - t) if self.seconds > t else None

    @property
    def done(self) -> int:
        return self.marks[-1][1] if self.marks else 0

    @property
    def seconds(self) -> float:
        return self.marks[-1][0] if self.marks else 0.0


def prune_rates(url: str, db: str, most: int, batch_size: int = 500) -> tuple[Rates, list[str]]:
    """`prune --finished-before 7d` in batches of `batch_size`, stopped after about `most`
    executions. Returns its rates and the ids it removed."""
    return asyncio.run(_prune(url, db, most, batch_size))


async def _prune(url: str, db: str, most: int, batch_size: int) -> tuple[Rates, list[str]]:
    client: pymongo.AsyncMongoClient[Any] = pymongo.AsyncMongoClient(url)
    rates = Rates()
    start = time.perf_counter()

    def on_batch(report: Any) -> None:
        rates.marks.append((time.perf_counter() - start, int(report.removed)))

    try:
        batches = max(1, most // batch_size)
        report = await prune(
            client[db][EXECUTIONS],
            time.time() - WEEK,
            batch_size=batch_size,
            on_batch=on_batch,
            stop_after_batches=batches,
        )
        rates.stopped = int(report.batches) >= batches
        return rates, list(report.removed_ids)
    finally:
        await client.close()


def migrate_rates(url: str, db: str, cloner: Cloner, n: int, most: int, say: Any) -> tuple[Rates, float]:
    """A database of `min(n, most)` executions in harel's MongoStore's layout (clones of
    documents harel's store wrote), then `migrate up`: its rates over the pass that touches
    every execution, and the seconds of the whole run. The database is dropped after."""
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    client.drop_database(db)
    grow(client[db][EXECUTIONS], cloner, min(n, most), say, lambda: None)
    client.close()
    return asyncio.run(_migrate(url, db))


async def _migrate(url: str, db: str) -> tuple[Rates, float]:
    client: pymongo.AsyncMongoClient[Any] = pymongo.AsyncMongoClient(url)
    per_step: dict[int, Rates] = {}
    began: dict[int, float] = {}  # each step's clock starts at the previous batch's end
    start = last = time.perf_counter()
    m: Migrator

    def on_batch(version: int, direction: str, batches: int) -> None:
        nonlocal last
        now = time.perf_counter()
        t0 = began.setdefault(version, last)
        per_step.setdefault(version, Rates()).marks.append((now - t0, batches * m.batch_size))
        last = now

    try:
        m = Migrator(client[db], batch_size=500, on_batch=on_batch, say=lambda line: None)
        await m.up()
        seconds = time.perf_counter() - start
        await client.drop_database(db)
    finally:
        await client.close()
    # the step with the most batches is the pass over every execution
    return max(per_step.values(), key=lambda r: len(r.marks), default=Rates()), seconds
