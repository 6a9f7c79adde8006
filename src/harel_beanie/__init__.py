"""harel-beanie: a MongoDB store for harel's durable statecharts, modelled with Beanie.

`MongoStore` (sync, PyMongo) and `AsyncMongoStore` (async, PyMongo's async API or Motor)
implement harel's `ExecutionStore` / `AsyncExecutionStore` on one document per execution,
committed with one conditional update. The Beanie documents (`ExecutionDocument`,
`CounterDocument`, `bind(prefix)`) are the schema; pass `DOCUMENT_MODELS` (or
`document_models(prefix)`) to your own `init_beanie` to query the store's data.
`AsyncMongoTransport` / `MongoTransport` are harel's transport on the same database, one round
trip per operation (`harel_beanie.transport`). `harel_beanie.testing` is a pytest plugin
giving apps' tests a ready store. `HistoryWriter` and `RecordingStore` record what a run asks
of its store, and `check` judges the recorded history: a `Verdict` of `Anomaly`s
(`harel_beanie.history`).
"""

from harel_beanie.core.commit import DEFAULT_DEDUPE_WINDOW
from harel_beanie.core.documents import (
    DOCUMENT_MODELS,
    SCHEMA_VERSION,
    CounterDocument,
    ExecutionDocument,
    bind,
    document_models,
)
from harel_beanie.core.errors import CommitOutcomeUnknown, ExecutionTooLarge, SchemaMismatch, StoreUnavailable
from harel_beanie.history import Anomaly, HistoryWriter, RecordingStore, Verdict, check
from harel_beanie.store.async_store import AsyncMongoStore
from harel_beanie.store.connect import RetryPolicy, mask_url
from harel_beanie.store.settings import DEFAULT_WRITE_CONCERN
from harel_beanie.store.sync_store import MongoStore
from harel_beanie.transport import AsyncMongoTransport, MongoTransport

__all__ = [
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
    "bind",
    "check",
    "document_models",
    "mask_url",
]
