"""Every door of the package's public paths, found by introspection: the functions, the
constructors, classmethods and methods of the classes each public path exports, each
parameter with the kind of value it takes; and every flag of the command line, read from
its parsers. The hostile layers (tests/support/doors/test_hostile_options.py) feed each the values of
the wrong type or range, so a door added later is tried without anyone listing it.

A parameter's kind comes from its annotation (`int`, `float`, `bool`, `str`, or Optional
of one); a parameter of any other type is either a typed object the door must refuse
anything else for (`OBJECTS`) or is named in `NOT_VALUES` with the reason no caller's value
reaches it as data. `test_every_door_is_known` fails on a parameter that is neither.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import harel_beanie

#: parameters whose value is the caller's own object, never a value taken as data: the reason
NOT_VALUES = {
    "client": "the driver's client the app built (PyMongo, Motor, mongomock)",
    "db": "the app's database handle",
    "executions": "the app's collection handle",
    "store": "the app's store object, its methods each a door of their own",
    "transport": "the app's transport object, its methods each a door of their own",
    "history": "a HistoryWriter, a door of its own",
    "auth": "the app's FastAPI dependency",
    "actions": "a DashboardActions, a door of its own",
    "metrics": "a StoreMetrics, a door of its own",
    "sampled": "the dashboard's own newest chart sample (queries.samples.latest_sample), read from its own collection",
    "registry": "the app's Prometheus registry",
    "tracer": "the app's OpenTelemetry tracer",
    "runner": "harel's runner the app already uses",
    "partitions": "a PartitionScope shared by a worker's store, transport and lease owner (refused by type: tests/core/test_partitions.py)",
    "secret": "the bytes an app's forms are signed with (refused unless bytes of 16 or more)",
    "definitions": "harel Definitions the app loaded",
    "retry": "a RetryPolicy, a door of its own",
    "write_concern": "PyMongo's WriteConcern, refused when unacknowledged",
    "read_concern": "PyMongo's ReadConcern",
    "clock": "a function the app passes (a test's clock)",
    "clock_ms": "a function the app passes (a test's clock)",
    "timers": "the store's next_timer, a function",
    "on_batch": "a callback of the app's",
    "say": "a callback of the app's",
    "on_ready": "a callback of the app's",
    "wrap_store": "a function of the app's, wrapping the store a worker opens",
    "wrap_transport": "a function of the app's, wrapping the transport a worker opens",
    "stop": "the app's asyncio.Event",
    "steps": "the migration steps, code of the package's or the app's",
    "archive": "an Archive, a door of its own",
    "client_options": "options handed to the driver, which checks them",
    "records": "history records, read from the package's own files",
    "replay": "the checker's replay, a function",
    "verdict": "the Verdict check() returned (refused by type: tests/reliability/test_reliability_history.py)",
    "path": "a file path of the app's (str or os.PathLike), opened as a file",
    "paths": "file paths of the app's, opened as files",
    "argv": "the command line, whose flags are the doors of `cli_flags`",
    "flt": "an ExecutionFilter, a door of its own (every field checked when built)",
    "doc": "a document class, checked by the queries (tests/support/doors/test_hostile_values.py)",
    "model": "a pydantic model class of the package's own",
    "record": "a history record, a mapping the writer serialises as JSON",
    "docs": "stored documents the engine hands an archive",
    "removed": "stored documents the engine hands an archive",
    "m": "the migration engine's own view, passed by the engine",
    "plan": "a function of the migration step's",
    "projection": "a projection the migration step declares",
    "before": "a callback of the migration step's (Migrator.write_guarded)",
    "report": "a PruneReport the package made",
    "error": "an exception the app caught",
    "extra": "options handed to the driver, which checks them",
    "exe": "harel's Execution, checked by the store's commit (tests/support/doors/test_hostile_values.py)",
}
#: parameters that take one type of object: anything else must be refused naming them
OBJECTS = {"lease", "event"}
#: classes that are records the package returns or raises, not doors: the reason
RECORDS = {
    "Anomaly": "a finding the checker reports",
    "Verdict": "the checker's report",
    "Backlog": "what backlog() read",
    "Page": "a page the listing read",
    "PruneReport": "what prune did",
    "ArchiveContents": "what read_jsonl read",
    "CorruptLine": "a line read_jsonl could not read",
    "LayoutStatus": "what the migrator read",
    "StepReport": "what a migration step did",
    "Operation": "a paired record of a history file",
    "ReplayCase": "what the checker hands its replay",
    "QueueLease": "what a claim returns",
    "Removal": "what the archive's reader returns",
    "Step": "the base class of migration steps (code, not values)",
}
#: methods tried elsewhere: the reason
ELSEWHERE = {
    "MongoStore": "every method: tests/support/doors/test_hostile_values.py",
    "AsyncMongoStore": "every method: tests/support/doors/test_hostile_values.py",
    "RecordingStore": "the store's methods, handed through to the recorded store",
    "RecordingTransport": "the transport's methods, handed through to the recorded transport",
    "ScopedStore": "the store's methods, handed through to the scoped store",
    "InstrumentedStore": "the store's methods, handed through to the wrapped store",
}
KINDS = {"int": "int", "float": "number", "bool": "bool", "str": "str", "str|Status": "str"}


def public_paths() -> list[str]:
    """The package and each public path in it: every module at its top, and every
    subpackage that says what it exports (`__all__`); the layers below say nothing."""
    out = ["harel_beanie"]
    for m in pkgutil.iter_modules(harel_beanie.__path__):
        if m.name.startswith("_"):
            continue
        name = f"harel_beanie.{m.name}"
        if not m.ispkg or hasattr(importlib.import_module(name), "__all__"):
            out.append(name)
    return out


def _exports(path: str) -> Iterator[tuple[str, Any]]:
    module = importlib.import_module(path)
    names = getattr(module, "__all__", None)
    if names is None:  # a plugin module: its own public functions (pytest's hooks aside)
        names = [
            n
            for n, o in vars(module).items()
            if inspect.isfunction(o)
            and o.__module__ == path
            and not n.startswith(("_", "pytest_"))
            and not hasattr(o, "_fixture_function_marker")
        ]
    for name in names:
        yield name, getattr(module, name)


def _ours(fn: Any) -> bool:
    return str(getattr(fn, "__module__", "")).startswith("harel_beanie")


def _callables(name: str, obj: Any) -> Iterator[tuple[str, Callable[..., Any]]]:
    if not inspect.isclass(obj):
        if callable(obj) and _ours(obj):
            yield name, obj
        return
    from pydantic import BaseModel

    if issubclass(obj, (BaseException, BaseModel)) or getattr(obj, "_is_protocol", False) or name in RECORDS:
        return
    for attr, raw in vars(obj).items():
        if attr.startswith("_") and attr != "__init__":
            continue
        fn = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
        if not inspect.isfunction(fn) or not _ours(fn):
            continue
        if name in ELSEWHERE and attr not in ("__init__", "from_url"):
            continue
        yield f"{name}.{attr}", getattr(obj, attr)
    for base in obj.__mro__[1:]:  # a constructor inherited from a base of the package's
        if base is object or not _ours(base):
            continue
        if "__init__" not in vars(obj) and "__init__" in vars(base):
            yield f"{name}.__init__", obj.__init__
            break


@dataclass(frozen=True)
class Door:
    call: str  # the qualified name, e.g. "MongoTransport.claim"
    fn: Any
    param: str
    kind: Optional[str]  # "int", "number", "bool", "str", "object"; None: NOT_VALUES
    optional: bool
    default: Any


def kind_of(annotation: Any) -> tuple[Optional[str], bool]:
    text = str(annotation).replace("typing.", "").replace(" ", "")
    optional = text.startswith("Optional[") or text.endswith("|None")
    inner = text.removeprefix("Optional[").removesuffix("]") if text.startswith("Optional[") else text
    inner = inner.removesuffix("|None")
    return KINDS.get(inner), optional


def doors() -> list[Door]:
    """Every parameter of every door of every public path, once (a class exported by two
    paths is one door)."""
    seen: set[str] = set()
    out: list[Door] = []
    for path in public_paths():
        for name, obj in _exports(path):
            for call, fn in _callables(name, obj):
                if call in seen:  # a class two paths export (its classmethods are new objects each time)
                    continue
                seen.add(call)
                params = list(inspect.signature(fn).parameters.values())
                for p in params:
                    if p.name in ("self", "cls") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                        continue
                    kind, optional = kind_of(p.annotation)
                    if kind is None and p.name in OBJECTS:
                        kind = "object"
                    out.append(Door(call, fn, p.name, kind, optional, p.default))
    return out


# --- the command line ---------------------------------------------------------------------


def cli_flags() -> list[tuple[str, str, argparse.Action]]:
    """Every option of every command, read from the parsers themselves: (command, flag, action)."""
    from harel_beanie.commands.cli import build_parser

    out = []
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                for a in sub._actions:
                    if a.option_strings and not isinstance(a, argparse._HelpAction):
                        out.append((command, max(a.option_strings, key=len), a))
    return out
