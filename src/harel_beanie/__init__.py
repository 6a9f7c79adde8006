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
- `harel_beanie.retention` — prune, its archives, the TTL index.
- `harel_beanie.migrate` — the layout migrations (`Migrator`, the steps).
- `harel_beanie.deploy` — what an app's own worker takes: `Worker`, model loading, the scoped relay.
- `harel_beanie.dashboard` — the web dashboard's router (the `dashboard` extra).
- `harel_beanie.testing` — the pytest plugin for apps' own tests.
- the command line: `harel-beanie` (or `python -m harel_beanie`), each command and flag as
  `--help` shows it.

Everything else (`core`, `store`, `commands`, `demo`, `harness`, and any module below a
package's face) is the house's own and may change in any release.
"""

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
from harel_beanie.core.errors import CommitOutcomeUnknown, ExecutionTooLarge, SchemaMismatch, StoreUnavailable
from harel_beanie.deploy import Worker
from harel_beanie.history import Anomaly, HistoryWriter, RecordingStore, Verdict, check
from harel_beanie.store.async_store import AsyncMongoStore
from harel_beanie.store.connect import RetryPolicy, mask_url
from harel_beanie.store.settings import DEFAULT_WRITE_CONCERN
from harel_beanie.store.sync_store import MongoStore
from harel_beanie.transport import AsyncMongoTransport, MongoTransport

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
