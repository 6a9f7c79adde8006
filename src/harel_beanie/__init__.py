"""harel-beanie: a MongoDB store for harel's durable statecharts, modelled with Beanie.

`MongoStore` (sync) and `AsyncMongoStore` (async), on PyMongo, implement harel's
`ExecutionStore` / `AsyncExecutionStore` on one document per execution, committed with one
conditional update. The Beanie documents (`ExecutionDocument`, `CounterDocument`, their
projection views, `bind(prefix)`) are the schema: pass `DOCUMENT_MODELS` (or
`document_models(prefix)`) to your own `init_beanie` to query the store's data.

Public paths. Each is a package's face (its `__init__`, with `__all__`); a name leaves one of
these lists only with a CHANGELOG entry saying what replaces it:

- `harel_beanie` — the stores, the schema, the errors and settings, the transport classes,
  `Worker` (harel's worker on them, safe at any concurrency: what `harel-beanie worker` runs)
  and the history checker's main names.
- `harel_beanie.queries` — typed, index-backed reads for pages and scripts.
- `harel_beanie.transport` — harel's transport on the store's database, and its documents.
- `harel_beanie.history` — recorded histories of a run and their checker.
- `harel_beanie.telemetry` — Prometheus figures and the timing and tracing wrapper.
- `harel_beanie.retention` — prune, its archives, a worker's retention schedule, dropping the retired TTL index.
- `harel_beanie.migrate` — the layout migrations (`Migrator`, the steps).
- `harel_beanie.deploy` — what an app's own worker takes: `Worker`, model loading, the scoped relay.
- `harel_beanie.dashboard` — the web dashboard's router (the `dashboard` extra).
- `harel_beanie.testing` — the pytest plugin for apps' own tests.
- the command line: `harel-beanie` (or `python -m harel_beanie`), each command and flag as
  `--help` shows it.

Everything else (`core`, `store`, `commands`, `demo`, `harness`, and any module below a
package's face) is the house's own and may change in any release.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harel_beanie.core.commit import DEFAULT_DEDUPE_WINDOW
    from harel_beanie.core.documents import (
        DOCUMENT_MODELS,
        LAYOUT_1_INDEXES,
        NODE_COUNTER_ID,
        PENDING,
        SCHEMA_MARKER_ID,
        SCHEMA_VERSION,
        CounterDocument,
        ExecutionDocument,
        LegacySummaryView,
        LoadView,
        OutboxItem,
        OutboxView,
        PendingView,
        SpawnItem,
        SpawnView,
        SummaryFields,
        SummaryView,
        TimerView,
        Tombstone,
        TraceView,
        VersionView,
        bind,
        document_models,
        index_models,
        projection,
    )
    from harel_beanie.core.errors import ExecutionTooLarge, SchemaMismatch, StoreUnavailable
    from harel_beanie.core.outcome import CommitOutcomeUnknown
    from harel_beanie.deploy import Worker
    from harel_beanie.history import Anomaly, HistoryWriter, RecordingStore, Verdict, check
    from harel_beanie.store.async_store import AsyncMongoStore
    from harel_beanie.store.connect import RetryPolicy, mask_url
    from harel_beanie.store.settings import DEFAULT_WRITE_CONCERN
    from harel_beanie.store.sync_store import MongoStore
    from harel_beanie.transport import AsyncMongoTransport, MongoTransport

# Each name is imported on first use: `import harel_beanie` (which every submodule's import
# runs first) then costs nothing, so the command line below this face answers `--version` or
# a wrong flag without loading the driver, Beanie and harel's engine.
_WHERE: dict[str, str] = {
    "DEFAULT_DEDUPE_WINDOW": "harel_beanie.core.commit",
    "CounterDocument": "harel_beanie.core.documents",
    "DOCUMENT_MODELS": "harel_beanie.core.documents",
    "ExecutionDocument": "harel_beanie.core.documents",
    "LAYOUT_1_INDEXES": "harel_beanie.core.documents",
    "LegacySummaryView": "harel_beanie.core.documents",
    "LoadView": "harel_beanie.core.documents",
    "NODE_COUNTER_ID": "harel_beanie.core.documents",
    "OutboxItem": "harel_beanie.core.documents",
    "OutboxView": "harel_beanie.core.documents",
    "PENDING": "harel_beanie.core.documents",
    "PendingView": "harel_beanie.core.documents",
    "SCHEMA_MARKER_ID": "harel_beanie.core.documents",
    "SCHEMA_VERSION": "harel_beanie.core.documents",
    "SpawnItem": "harel_beanie.core.documents",
    "SpawnView": "harel_beanie.core.documents",
    "SummaryFields": "harel_beanie.core.documents",
    "SummaryView": "harel_beanie.core.documents",
    "TimerView": "harel_beanie.core.documents",
    "Tombstone": "harel_beanie.core.documents",
    "TraceView": "harel_beanie.core.documents",
    "VersionView": "harel_beanie.core.documents",
    "bind": "harel_beanie.core.documents",
    "document_models": "harel_beanie.core.documents",
    "index_models": "harel_beanie.core.documents",
    "projection": "harel_beanie.core.documents",
    "ExecutionTooLarge": "harel_beanie.core.errors",
    "SchemaMismatch": "harel_beanie.core.errors",
    "StoreUnavailable": "harel_beanie.core.errors",
    "CommitOutcomeUnknown": "harel_beanie.core.outcome",
    "Worker": "harel_beanie.deploy",
    "Anomaly": "harel_beanie.history",
    "HistoryWriter": "harel_beanie.history",
    "RecordingStore": "harel_beanie.history",
    "Verdict": "harel_beanie.history",
    "check": "harel_beanie.history",
    "AsyncMongoStore": "harel_beanie.store.async_store",
    "RetryPolicy": "harel_beanie.store.connect",
    "mask_url": "harel_beanie.store.connect",
    "DEFAULT_WRITE_CONCERN": "harel_beanie.store.settings",
    "MongoStore": "harel_beanie.store.sync_store",
    "AsyncMongoTransport": "harel_beanie.transport",
    "MongoTransport": "harel_beanie.transport",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'harel_beanie' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup finds it without coming here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "LAYOUT_1_INDEXES",
    "NODE_COUNTER_ID",
    "PENDING",
    "SCHEMA_MARKER_ID",
    "LegacySummaryView",
    "LoadView",
    "OutboxItem",
    "OutboxView",
    "PendingView",
    "SpawnItem",
    "SpawnView",
    "SummaryFields",
    "SummaryView",
    "TimerView",
    "Tombstone",
    "TraceView",
    "VersionView",
    "index_models",
    "projection",
    "Anomaly",
    "AsyncMongoStore",
    "AsyncMongoTransport",
    "CommitOutcomeUnknown",
    "CounterDocument",
    "DEFAULT_DEDUPE_WINDOW",
    "DOCUMENT_MODELS",
    "DEFAULT_WRITE_CONCERN",
    "ExecutionDocument",
    "ExecutionTooLarge",
    "HistoryWriter",
    "MongoStore",
    "MongoTransport",
    "RecordingStore",
    "RetryPolicy",
    "SCHEMA_VERSION",
    "SchemaMismatch",
    "StoreUnavailable",
    "Verdict",
    "Worker",
    "bind",
    "check",
    "document_models",
    "mask_url",
]
