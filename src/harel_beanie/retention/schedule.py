"""A worker's retention: prune's flow on a schedule, over the partitions the worker leases.

Why this module exists: the counts stay exact only if every execution leaves the database
through prune's removal (marked leaving, folded out of its counter, deleted while counted as
nothing: `harel_beanie.core.counting`, Rule 5). The TTL index let the server delete finished
executions by age behind the counters' back, and the counts drifted for good, so it is
retired; what users turned it on for, retention that needs no cron job, is this instead:
`harel-beanie worker --retain 30d`, or `Worker(..., retain="30d")` in an app's own process.

What a run is: `prune(executions, now - age)` with the worker's archive (if any), kept to the
partitions the worker leases at each window it reads (`PartitionScope.sweep_filter`). So N
workers divide the removals as they divide the claims and the sweeps, and a partition whose
lease moves is taken by its new owner's next run. Ownership only divides the work: the
removal's own guards keep two removals of one execution apart (each removal archived once,
reported once, a purge archived by neither: `harel_beanie.retention.removal`), so a worker
whose lease lapsed mid-run, or a manual `prune` beside the workers, changes nothing.

When: every `RETAIN_EVERY` seconds, each wait drawn within `JITTER` of it. A retention
period is days; a minute's delay past it is nothing, and a run over an already-pruned
database costs a few empty windows (they double in width as they come back empty). The
jitter keeps workers started together (a deployment's rollout) from all reading at once.
The first run waits too: a worker restarting in a crash loop does not prune on each start.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from harel_beanie.core.ages import parse_age
from harel_beanie.core.arguments import BadArgument, BadArgumentType, require_int, require_seconds, require_str
from harel_beanie.core.partitions import PartitionScope
from harel_beanie.retention.archive import Archive
from harel_beanie.retention.pruning import TTL_INDEX, PruneReport, drop_ttl, has_ttl, prune

log = logging.getLogger("harel_beanie.retention")

#: seconds between two runs of a worker's retention, on average
RETAIN_EVERY = 60.0
#: the longest period a worker takes: a day (a longer one is a misread unit)
MAX_RETAIN_EVERY = 86400.0
#: each wait is drawn in [1 - JITTER, 1 + JITTER] times the period
JITTER = 0.2
#: executions per batch, as `prune`'s default
BATCH = 500


@dataclass(frozen=True)
class Retention:
    """What a worker retains: executions finished more than `age` seconds ago are removed
    (into `archive` when given), a run every `every` seconds or so, in batches of `batch_size`."""

    age: float
    archive: Optional[Archive] = None
    every: float = RETAIN_EVERY
    batch_size: int = BATCH


def retention_of(
    retain: Any, every: Any = RETAIN_EVERY, archive: Optional[Archive] = None, batch_size: Any = BATCH
) -> Retention:
    """A `Retention` from a worker's arguments, each refused naming it: `retain` an age with
    its unit (`30d`: a bare number is refused, seconds or days?), `retain_every` seconds."""
    text = require_str("retain", retain)
    try:
        age = parse_age(text)
    except BadArgument as exc:
        raise BadArgument("retain", str(exc).removeprefix(exc.argument + " ")) from None
    if age <= 0:
        raise BadArgument("retain", f"{text!r} keeps nothing: give an age above 0 (e.g. 30d)")
    every = require_seconds("retain_every", every, positive=True, high=MAX_RETAIN_EVERY)
    if archive is not None and not all(callable(getattr(archive, m, None)) for m in ("recover", "begin", "finish")):
        raise BadArgumentType("archive", "an Archive (JsonlArchive, CollectionArchive)", archive)
    batch_size = require_int("batch_size", batch_size, low=1, high=2**31 - 1)
    return Retention(age=age, archive=archive, every=every, batch_size=batch_size)


async def retain_once(
    executions: Any, retention: Retention, partitions: Optional[PartitionScope], clock: Callable[[], float]
) -> PruneReport:
    """One run: prune what finished more than the age ago, in the partitions the worker
    leases now (all of them with no scope: on harel's transport every worker retains all)."""
    return await prune(
        executions,
        clock() - retention.age,
        archive=retention.archive,
        batch_size=retention.batch_size,
        clock=clock,
        partitions=partitions,
    )


async def retain_forever(
    executions: Any,
    retention: Retention,
    partitions: Optional[PartitionScope],
    stop: asyncio.Event,
    *,
    clock: Callable[[], float] = time.time,
    say: Callable[[str], Any] = log.warning,
    name: str = "worker",
    draw: Callable[[], float] = random.random,
) -> None:
    """Run `retain_once` every `retention.every` seconds (jittered) until `stop`. First, a TTL
    index left by an older release is dropped: a worker told to retain replaces it, and its
    expiries would drift the counts. A failed run is logged and the next one tries again."""
    try:
        if await has_ttl(executions):
            say(f"{name}: {await drop_ttl(executions)}: retention by this worker replaces it")
    except Exception as exc:  # an outage: the next start tries again; retention goes on meanwhile
        log.warning("could not check for the TTL index %s (%r)", TTL_INDEX, exc)
    while not stop.is_set():
        wait = retention.every * (1.0 - JITTER + 2.0 * JITTER * draw())
        try:
            await asyncio.wait_for(stop.wait(), timeout=wait)
            return
        except asyncio.TimeoutError:
            pass
        try:
            report = await retain_once(executions, retention, partitions, clock)
        except Exception as exc:  # an outage, a server error: the next run continues where this one stopped
            log.warning("retention run failed (%r); retrying in about %ss", exc, retention.every, exc_info=True)
            continue
        if report.removed or report.recovered:
            archived = "" if retention.archive is None else " (archived)"
            say(
                f"{name}: retention removed {report.removed} execution(s) finished before "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(report.before))} UTC{archived}"
                + (f", archived {report.recovered} left by an interrupted run" if report.recovered else "")
            )
