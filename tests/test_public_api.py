"""The public API does not move: every path a user imports (the package, `queries`,
`documents`, `testing`, `dashboard`, `migrate`, `retention`, `metrics`, `instrument`, `loader`,
`relay`, `transport`, `history`) still holds every name it held, whatever folder the code behind it lives in. Removing
or renaming one of these is a change users feel; this test makes it a deliberate one."""

from __future__ import annotations

import importlib

import pytest

PUBLIC: dict[str, set[str]] = {
    "harel_beanie": {
        "AsyncMongoStore",
        "CounterDocument",
        "DEFAULT_DEDUPE_WINDOW",
        "DOCUMENT_MODELS",
        "DEFAULT_WRITE_CONCERN",
        "ExecutionDocument",
        "ExecutionTooLarge",
        "MongoStore",
        "RetryPolicy",
        "SCHEMA_VERSION",
        "SchemaMismatch",
        "StoreUnavailable",
        "bind",
        "document_models",
        "mask_url",
        "AsyncMongoTransport",
        "MongoTransport",
        "HistoryWriter",
        "RecordingStore",
        "check",
        "Verdict",
        "Anomaly",
        "CommitOutcomeUnknown",
    },
    "harel_beanie.history": {
        "KINDS",
        "Anomaly",
        "HistoryWriter",
        "Operation",
        "RecordingStore",
        "RecordingTransport",
        "Replay",
        "ReplayCase",
        "Verdict",
        "check",
        "pair",
        "read_history",
    },
    "harel_beanie.transport": {
        "AsyncMongoTransport",
        "MongoTransport",
        "QueueDocument",
        "OverflowDocument",
        "QueueLease",
        "bind_queues",
    },
    "harel_beanie.queries": {
        "STATUSES",
        "Backlog",
        "ExecutionDetail",
        "ExecutionFilter",
        "ExecutionRow",
        "Page",
        "TimerRow",
        "backlog",
        "by_status",
        "children_of",
        "execution_detail",
        "executions",
        "executions_page",
        "failed_since",
        "status_counts",
        "stuck_running",
        "waiting_on_timer",
    },
    "harel_beanie.documents": {
        "SCHEMA_VERSION",
        "PENDING",
        "SCHEMA_MARKER_ID",
        "NODE_COUNTER_ID",
        "OutboxItem",
        "SpawnItem",
        "SummaryFields",
        "ExecutionDocument",
        "LAYOUT_1_INDEXES",
        "Tombstone",
        "CounterDocument",
        "LoadView",
        "VersionView",
        "SummaryView",
        "LegacySummaryView",
        "OutboxView",
        "PendingView",
        "SpawnView",
        "TimerView",
        "TraceView",
        "projection",
        "bind",
        "index_models",
        "document_models",
        "DOCUMENT_MODELS",
    },
    "harel_beanie.dashboard": {"dashboard_router", "DashboardActions", "token_auth", "no_auth"},
    "harel_beanie.migrate": {
        "ADDED_FIELDS",
        "BATCH_SIZE",
        "LayoutStatus",
        "MigrationError",
        "Migrator",
        "PROGRESS_ID",
        "STEPS",
        "Step",
        "StepReport",
        "run_beanie_step",
    },
    "harel_beanie.retention": {
        "FINISHED",
        "TTL_INDEX",
        "parse_age",
        "parse_before",
        "PruneReport",
        "Archive",
        "JsonlArchive",
        "CollectionArchive",
        "Removal",
        "candidates_filter",
        "prune",
        "ensure_ttl",
        "dumps_report",
    },
    "harel_beanie.metrics": {"COMMIT_BUCKETS", "StoreMetrics", "new_registry"},
    "harel_beanie.instrument": {"OPERATIONS", "otel_tracer", "InstrumentedStore"},
    "harel_beanie.loader": {"default_models_dir", "load_models"},
    "harel_beanie.relay": {"ScopedStore", "sweep"},
}

#: the pytest plugin: what an app's conftest and tests name
TESTING = {"harel_store", "harel_async_store", "harel_mongo_url", "memory_store", "memory_async_store"}


@pytest.mark.parametrize("path", sorted(PUBLIC))
def test_each_public_path_keeps_its_names(path: str) -> None:
    module = importlib.import_module(path)
    exported = set(getattr(module, "__all__", ()))
    assert PUBLIC[path] <= exported, f"{path} no longer exports {sorted(PUBLIC[path] - exported)}"
    missing = [name for name in exported if not hasattr(module, name)]
    assert not missing, f"{path}.__all__ names what it does not hold: {missing}"


def test_the_pytest_plugin_keeps_its_fixtures_and_helpers() -> None:
    module = importlib.import_module("harel_beanie.testing")
    assert all(hasattr(module, name) for name in TESTING), sorted(n for n in TESTING if not hasattr(module, n))


def test_the_store_classes_are_the_same_object_on_every_path() -> None:
    import harel_beanie
    from harel_beanie import documents
    from harel_beanie.store.async_store import AsyncMongoStore
    from harel_beanie.store.sync_store import MongoStore

    assert harel_beanie.MongoStore is MongoStore and harel_beanie.AsyncMongoStore is AsyncMongoStore
    assert documents.ExecutionDocument is harel_beanie.ExecutionDocument
