"""Prometheus figures for the store: what is stored and pending (read on each scrape) and
what commits cost (observed as they happen, by `harel_beanie.telemetry.instrument`).

Why this module exists: an operator alerts on a `/metrics` endpoint.
`prometheus-client` is an optional dependency (the `dashboard` extra) and its default global
registry is shared by everything in a process, so nothing is registered at import: the app
passes the `CollectorRegistry` to register on, once, and serves it where it likes (the
dashboard router mounts it at `/metrics`).

The gauges are set from `harel_beanie.queries.backlog` when `refresh()` is awaited (the
endpoint does it per scrape): each figure there is read through an index, so a scrape costs
about what `harel-beanie status` costs, not a pass over every document's data.
"""

from __future__ import annotations

import math
import time
from typing import Any, Mapping, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from harel_beanie import queries
from harel_beanie.core.arguments import require_seconds, require_str
from harel_beanie.core.documents import ExecutionDocument
from harel_beanie.queries.samples import use_sample

#: commits take milliseconds on mongod, up to a second on a loaded server or SecantusDB
COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class StoreMetrics:
    """The store's metrics, registered on `registry` (never the global one)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        """Kept whole: it declares every figure on the registry, one statement each, where a reader looks them up."""
        self.registry = registry
        self.executions = Gauge(
            "harel_executions",
            "Executions stored, by definition and status",
            ["definition", "status"],
            registry=registry,
        )
        self.purged = Gauge(
            "harel_executions_purged", "Tombstones: ids whose execution a purge removed", registry=registry
        )
        self.unbuilt = Gauge(
            "harel_counts_unbuilt_partitions",
            "Partitions whose execution counts are not built yet (the workers and `harel-beanie migrate up` "
            "build them): harel_executions and harel_executions_purged leave their executions out while above 0",
            registry=registry,
        )
        self.pending = Gauge(
            "harel_pending_entries",
            "Pending work not yet relayed: outbox entries (events) and spawns (children); from the per-minute "
            "sample (a dashboard or a worker takes one) when one at most a minute old is kept, else read at the scrape",
            ["kind"],
            registry=registry,
        )
        self.oldest_pending = Gauge(
            "harel_pending_oldest_age_seconds",
            "Age of the oldest pending entry, by kind (0 when none); from the per-minute sample (a dashboard or a worker "
            "takes one) when one at most a minute old is kept, else read at the scrape",
            ["kind"],
            registry=registry,
        )
        self.sample_age = Gauge(
            "harel_pending_sample_age_seconds",
            "Age, at this scrape, of the per-minute sample harel_pending_entries and harel_pending_oldest_age_seconds "
            "came from (at most 60); NaN when they were read from the documents at this scrape",
            registry=registry,
        )
        self.timers_due = Gauge("harel_timers_due", "Executions holding a timer due now", registry=registry)
        self.timer_lateness = Gauge(
            "harel_timer_lateness_seconds",
            "How late the most overdue armed timer is (0 when none is due)",
            registry=registry,
        )
        self.stuck = Gauge(
            "harel_executions_silent",
            "Stuck RUNNING executions (up to 1000): silent for longer than the stuck threshold with no timer "
            "armed and nothing pending, or holding a timer due for longer than it; those waiting on a timer "
            "or on pending work are not counted",
            registry=registry,
        )
        self.commit_conflicts = Counter(
            "harel_commit_conflicts",
            "Commits refused by the version check (another writer moved first)",
            ["definition"],
            registry=registry,
        )
        self.commit_seconds = Histogram(
            "harel_commit_duration_seconds",
            "Wall time of a store commit, conflicts included",
            ["definition"],
            buckets=COMMIT_BUCKETS,
            registry=registry,
        )
        self.commit_errors = Counter(
            "harel_commit_errors",
            "Commits that raised something other than a conflict",
            ["definition", "error"],
            registry=registry,
        )

    async def refresh(
        self,
        *,
        doc: type[ExecutionDocument] = ExecutionDocument,
        stuck_after: float = 300.0,
        now: Optional[float] = None,
        sampled: Optional[Mapping[str, Any]] = None,
    ) -> queries.Backlog:
        """Read the stored figures (see `queries.backlog`) and set the gauges from them. With
        `sampled` (a recent sample of the pending entries: the dashboard's charts keep one a
        minute), the entries' counts and ages come from it instead of a read of every
        document holding one."""
        now = time.time() if now is None else now
        # the lateness needs the soonest timer only; the stuck are counted up to 1000, each
        # read through an index holding only candidates (core.stuck)
        b = await queries.backlog(
            doc=doc, stuck_after=stuck_after, now=now, show=1000, timers=1, entries=sampled is None, oldest=0
        )
        if sampled is not None:
            use_sample(b, sampled)
        # a definition/status pair that no longer exists must disappear, not keep its last value
        self.executions.clear()
        for definition, per in b.counts.items():
            for status, n in per.items():
                self.executions.labels(definition, status).set(n)
        self.purged.set(b.purged)
        self.unbuilt.set(len(b.unbuilt))
        self.pending.labels("outbox").set(b.pending_outbox)
        self.pending.labels("spawn").set(b.pending_spawns)
        self.oldest_pending.labels("outbox").set(b.oldest_outbox_age or 0.0)
        self.oldest_pending.labels("spawn").set(b.oldest_spawn_age or 0.0)
        # a scraper tells a figure read now from one a minute old by this gauge (NaN: read now)
        self.sample_age.set(
            max(0.0, now - b.entries_at) if sampled is not None and b.entries_at is not None else math.nan
        )
        self.timers_due.set(b.due_timers)
        late = [now - t["fire_at"] for t in b.next_timers if t["fire_at"] <= now]
        self.timer_lateness.set(max(late, default=0.0))
        self.stuck.set(len(b.stuck))
        return b

    def observe_commit(self, definition: str, seconds: float, error: Optional[BaseException] = None) -> None:
        """Record one commit (called by `harel_beanie.telemetry.instrument.InstrumentedStore`)."""
        from harel.engine.store.base import StoreConflict

        definition = require_str("definition", definition)  # a label: a dict would be its repr
        seconds = require_seconds("seconds", seconds)  # a NaN or infinite sum spoils every later rate
        self.commit_seconds.labels(definition).observe(seconds)
        if isinstance(error, StoreConflict):
            self.commit_conflicts.labels(definition).inc()
        elif error is not None:
            self.commit_errors.labels(definition, type(error).__name__).inc()

    def render(self) -> bytes:
        """The registry in Prometheus' text format."""
        return bytes(generate_latest(self.registry))


def new_registry() -> Any:
    """A fresh registry (what the standalone dashboard serves)."""
    return CollectorRegistry(auto_describe=True)
