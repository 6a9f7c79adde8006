"""The public API does not move: every path a user imports (each listed in the package's
docstring) still holds every name it held, whatever folder the code behind it lives in, and
each name has one path. Removing or renaming one of these is a change users feel; this test
makes it a deliberate one."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

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
        "Worker",
        "Anomaly",
        "CommitOutcomeUnknown",
        "PENDING",
        "SCHEMA_MARKER_ID",
        "NODE_COUNTER_ID",
        "OutboxItem",
        "SpawnItem",
        "SummaryFields",
        "LAYOUT_1_INDEXES",
        "Tombstone",
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
        "index_models",
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
        "stories",
        "story",
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
        "stuck",
        "stuck_running",
        "waiting_on_timer",
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
        "drop_ttl",
        "dumps_report",
    },
    "harel_beanie.telemetry": {
        "COMMIT_BUCKETS",
        "StoreMetrics",
        "new_registry",
        "OPERATIONS",
        "otel_tracer",
        "InstrumentedStore",
    },
    "harel_beanie.deploy": {"default_models_dir", "load_models", "HarelSeamChanged", "ScopedStore", "Worker", "sweep"},
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
    from harel_beanie.core import documents
    from harel_beanie.store.async_store import AsyncMongoStore
    from harel_beanie.store.sync_store import MongoStore

    assert harel_beanie.MongoStore is MongoStore and harel_beanie.AsyncMongoStore is AsyncMongoStore
    assert documents.ExecutionDocument is harel_beanie.ExecutionDocument


def test_the_package_docstring_lists_exactly_the_public_paths() -> None:
    import harel_beanie

    listed = set(re.findall(r"^- `(harel_beanie[\w.]*)`", harel_beanie.__doc__ or "", re.M))
    assert listed == set(PUBLIC) | {"harel_beanie.testing"}, sorted(listed ^ (set(PUBLIC) | {"harel_beanie.testing"}))


def test_no_module_at_the_top_is_a_second_name() -> None:
    """At the top of the package sit only its face, `python -m`'s entry and the pytest
    plugin: every other public path is a package's own `__init__`, so a name has one path."""
    top = Path(importlib.import_module("harel_beanie").__file__ or "").parent
    assert sorted(p.name for p in top.glob("*.py")) == ["__init__.py", "__main__.py", "testing.py"]


def test_each_public_name_has_one_path() -> None:
    """No two faces export the same object under a name (the package's own face aside, which
    gathers the main names of the others)."""
    seen: dict[int, str] = {}
    clashes = []
    for path in sorted(PUBLIC):
        if path == "harel_beanie":
            continue
        module = importlib.import_module(path)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if isinstance(obj, (int, float, str, tuple, frozenset)):
                continue  # constants compare by value; only classes and functions have an identity worth one path
            if id(obj) in seen:
                clashes.append(f"{path}.{name} is also {seen[id(obj)]}")
            seen[id(obj)] = f"{path}.{name}"
    assert not clashes, clashes
