"""Hostile values at every door, as a test layer: the test finds the doors itself (every public
query of `harel_beanie.queries`, every field of `ExecutionFilter`, every public method of both
stores, each of their parameters) and feeds each parameter the values of tests/hostile.py,
with the rule of `harel_beanie.core.arguments` as the oracle:

- refused: a TypeError or ValueError whose message names the parameter (and, for a store
  method, every stored document as it was);
- accepted: only a plain value of the type the parameter takes (a finite number, an int in
  range, a bool, a str BSON can hold, one of harel's statuses, one of the store's document
  classes), and the answer equals the literal lookup: the same question asked of the seeded
  documents in Python, with the value compared as it is.

A door added later is fed the same values without anyone listing it: `test_every_door_is_known`
fails until its parameters have a kind below.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import uuid
from typing import Any, Callable, Iterator, Optional

import pymongo
import pytest
from harel.engine.execution import Execution, Status
from harel.engine.store.base import StoreConflict, TimerOp
from harel.spec.states import Event
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harel_beanie import AsyncMongoStore, MongoStore, queries
from harel_beanie.core.arguments import INT64_MAX, INT64_MIN
from harel_beanie.core.documents import ExecutionDocument, bind
from tests.both import BlockingAsyncStore
from tests.hostile import hostile
from tests.seeds import HOSTILE_IDS, NOW

SEEDED_TEXT = ["order-1", "order-1:Pay:0", "Order", "Hostile", "paid", "a/b", "$gt", "", "FAILED", *HOSTILE_IDS[:12]]
#: what each parameter takes: a kind, and the value a call uses when another parameter is tried
KINDS: dict[str, tuple[str, Any]] = {
    "execution_id": ("str", "order-1"),
    "parent_id": ("str", "order-1"),
    "definition_id": ("str", "Order"),
    "outcome": ("str", "paid"),
    "after": ("str", ""),
    "event_id": ("str", "ev"),
    "processed_event_id": ("str", None),
    "within": ("str", "order-1"),
    "prefix": ("str", "order"),
    "id_prefix": ("str", None),
    "path": ("str", "T"),
    "cursor": ("str", None),
    "since": ("time", NOW - 10**6),
    "updated_after": ("time", 0.0),
    "updated_before": ("time", NOW + 10**6),
    "fire_at": ("time", 5.0),
    "now": ("time", NOW),
    "before": ("time-or-inf", NOW + 10**6),
    "older_than": ("seconds", 60.0),
    "stuck_after": ("seconds", 60.0),
    "limit": ("count", 50),
    "show": ("count0", 10),
    "seq": ("int", 1),
    "expected_version": ("int", 1),
    "roots_only": ("bool", False),
    "hint": ("bool", False),
    "status": ("status", "FAILED"),
    "doc": ("doc", ExecutionDocument),
    "flt": ("filter", queries.ExecutionFilter()),
    # the parts of a commit that reach a key or a filter, each placed where harel puts it
    "exe": ("exe", None),
    "emits": ("emits", []),
    "timers": ("timers", ()),
    "spawns": ("spawns", ()),
    "trace": ("json", None),
    "entry": ("json", {"s": 1}),
}
#: parameters no caller's value reaches as data, with the reason
NOT_DOORS = {"step": "harel's own `Step` record, built by its runner from the definition"}
#: per-call exceptions to the kinds above
OVERRIDES: dict[tuple[str, str], tuple[str, Any]] = {
    ("list_executions", "status"): ("statuses", None),
    ("due_timers", "now"): ("time-or-inf", NOW),
    ("list_executions", "limit"): ("count", 100),
    ("next_timer", "after"): ("time", NOW),
}
#: store methods that only open or close it
LIFECYCLE = {"init", "close"}


def _kind(call: str, param: str) -> tuple[str, Any]:
    return OVERRIDES.get((call, param)) or KINDS[param]


# --- the doors, found by enumeration ---------------------------------------------------------


def query_doors() -> list[tuple[str, str]]:
    out = []
    for name in queries.__all__:
        obj = getattr(queries, name)
        if inspect.isfunction(obj):
            out += [(name, p) for p in inspect.signature(obj).parameters]
    out += [("ExecutionFilter", f.name) for f in dataclasses.fields(queries.ExecutionFilter)]
    return out


def store_doors(cls: type) -> list[tuple[str, str]]:
    out = []
    for name, fn in inspect.getmembers(cls, inspect.isfunction):
        if name.startswith("_") or name in LIFECYCLE:
            continue
        out += [(name, p) for p in list(inspect.signature(fn).parameters)[1:] if p not in NOT_DOORS]
    return out


def test_every_door_is_known() -> None:
    """Every parameter of every public query, filter field and store method has a kind here,
    so a new one is tried with the rest instead of being forgotten."""
    unknown = [(c, p) for c, p in query_doors() + store_doors(MongoStore) + store_doors(AsyncMongoStore)
               if p not in KINDS and (c, p) not in OVERRIDES]  # fmt: skip
    assert not unknown, f"give these parameters a kind in tests/test_hostile_values.py: {unknown}"
    assert sorted(store_doors(MongoStore)) == sorted(store_doors(AsyncMongoStore))


# --- what an accepted value may be -------------------------------------------------------------


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def plain(kind: str, v: Any) -> bool:
    """Whether `v` is a value of `kind` that may be used as a literal."""
    if kind == "str":
        return isinstance(v, str) and not any(0xD800 <= ord(c) <= 0xDFFF for c in v)
    checks: dict[str, Callable[[Any], bool]] = {
        "time": lambda v: _is_real(v) and math.isfinite(v),
        "time-or-inf": _is_real,
        "seconds": lambda v: _is_real(v) and math.isfinite(v) and v >= 0,
        "count": lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= INT64_MAX,
        "count0": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= INT64_MAX,
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and INT64_MIN <= v <= INT64_MAX,
        "bool": lambda v: isinstance(v, bool),
        "status": lambda v: isinstance(v, Status) or (isinstance(v, str) and v in queries.STATUSES),
        "statuses": lambda v: (
            isinstance(v, (list, tuple, set, frozenset))
            and all(isinstance(s, Status) or s in queries.STATUSES for s in v)
        ),
        "doc": lambda v: v in (ExecutionDocument, bind()[0]),
        "filter": lambda v: isinstance(v, queries.ExecutionFilter),
        "json": lambda v: True,  # stored as JSON text, never a key or a filter
    }
    return checks[kind](v)


def _in_place(kind: str, v: Any) -> Any:
    """The argument that carries `v` where a caller's value reaches the store: an execution's
    id, an emit's target, a timer's path, a spawned child's id."""
    if kind == "exe":
        return Execution.model_construct(id=v, definition_id="Order", version=0)
    if kind == "emits":
        return [(v, Event(kind="A"))]
    if kind == "timers":
        return (TimerOp("schedule", v, 1.0),)
    if kind == "spawns":
        return ((v, "R", {}),)
    return v


def _carried_ok(kind: str, v: Any) -> bool:
    return plain("str", v) if kind in ("exe", "emits", "timers", "spawns") else plain(kind, v)


# --- the literal lookups: each question asked of the seeded documents in Python ---------------


def _docs(db: Any) -> list[dict[str, Any]]:
    return [d for d in db.harel_executions.find({}) if "tomb" not in d]


def _ids(docs: list[dict[str, Any]], **eq: Any) -> list[str]:
    return sorted(d["_id"] for d in docs if all(type(d.get(k)) is str and d.get(k) == str(v) for k, v in eq.items()))


def literal(call: str, param: str, v: Any, docs: list[dict[str, Any]]) -> Optional[Callable[[Any], Any]]:
    """What a call answers when `param` is the literal `v`, or None where no single field answers."""
    text = str.__str__(v) if isinstance(v, str) else v
    if call == "children_of":
        return lambda got: sorted(r.id for r in got) == _ids(docs, parent_id=text)
    if call == "execution_detail":
        return lambda got: (got.id if got else None) == (text if _ids(docs, _id=text) else None)
    if call == "failed_since" and param == "definition_id":
        return lambda got: sorted(r.id for r in got) == _ids(docs, status="FAILED", definition_id=text)
    if call == "by_status":
        return lambda got: sorted(r.id for r in got) == _ids(docs, status=text)
    if call == "ExecutionFilter" and param == "id_prefix":
        return lambda got: sorted(r.id for r in got.rows) == sorted(d["_id"] for d in docs if d["_id"].startswith(text))
    if call == "ExecutionFilter" and param in ("definition_id", "outcome", "parent_id", "status"):
        return lambda got: sorted(r.id for r in got.rows) == _ids(docs, **{param: text})
    if call in ("executions", "executions_page") and param == "after":
        return lambda got: (
            [r.id for r in (got.rows if call == "executions_page" else got)]
            == sorted(d["_id"] for d in docs if d["_id"] > text)
        )
    if call == "load":
        return lambda got: (got.id if got else None) == (text if _ids(docs, _id=text) else None)
    if call == "ids_with_prefix":
        return lambda got: sorted(got) == sorted(d["_id"] for d in docs if d["_id"].startswith(text))
    return None


# --- running the calls -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seeded(mongo_url: str) -> Iterator[tuple[str, asyncio.AbstractEventLoop, AsyncMongoStore]]:
    """One seeded database for the read-only doors, with an async store on a loop of its own
    (hypothesis drives plain functions; each example runs its coroutine on this loop)."""
    from tests.seeds import seed_everything

    db_name = f"hbt_hostile_{uuid.uuid4().hex[:10]}"
    loop = asyncio.new_event_loop()

    async def make() -> AsyncMongoStore:
        store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db_name)
        await seed_everything(store, mongo_url, db_name, largest=False)
        return store

    store = loop.run_until_complete(make())
    yield db_name, loop, store
    loop.run_until_complete(store.close())
    loop.close()
    pymongo.MongoClient(mongo_url).drop_database(db_name)


def _call_query(call: str, param: str, v: Any, loop: asyncio.AbstractEventLoop) -> Any:
    if call == "ExecutionFilter":
        flt = queries.ExecutionFilter(**{param: v})
        return loop.run_until_complete(queries.executions_page(flt, limit=500))
    fn = getattr(queries, call)
    args: dict[str, Any] = {}
    for name, p in inspect.signature(fn).parameters.items():
        if name == param:
            args[name] = v
        elif p.default is inspect.Parameter.empty:
            args[name] = _kind(call, name)[1]
    result = fn(**args)
    if inspect.isawaitable(result):
        return loop.run_until_complete(result)  # type: ignore[arg-type]
    return loop.run_until_complete(result.to_list())


def _refused_naming(exc: BaseException, param: str) -> bool:
    return isinstance(exc, (TypeError, ValueError)) and param in str(exc)


def _check(call: str, param: str, v: Any, run: Callable[[], Any], docs: list[dict[str, Any]]) -> None:
    kind = _kind(call, param)[0]
    try:
        got = run()
    except StoreConflict:  # a literal id that names another version: harel's own answer
        got = None
        assert _carried_ok(kind, v), f"{call}({param}={v!r}) accepted a value that is not a plain {kind}"
        return
    except BaseException as exc:  # noqa: BLE001 - the oracle decides what may be raised
        assert _refused_naming(exc, param), f"{call}({param}={v!r}) raised {type(exc).__name__}: {exc}"
        return
    assert _carried_ok(kind, v), f"{call}({param}={v!r}) accepted a value that is not a plain {kind}"
    expected = literal(call, param, v, docs)
    if expected is not None:
        assert expected(got), f"{call}({param}={v!r}) is not the literal lookup: {got!r}"[:2000]


def _values(call: str, param: str) -> st.SearchStrategy[Any]:
    seeded_values = st.sampled_from(SEEDED_TEXT) if _kind(call, param)[0] in ("str", "status") else st.nothing()
    return st.one_of(hostile, seeded_values)


EXAMPLES = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip


@pytest.mark.parametrize("call,param", query_doors(), ids=[f"{c}-{p}" for c, p in query_doors()])
def test_every_query_door_refuses_or_reads_literally(seeded: Any, client: Any, call: str, param: str) -> None:
    db_name, loop, _ = seeded
    docs = _docs(client[db_name])

    @EXAMPLES
    @given(v=_values(call, param))
    def door(v: Any) -> None:
        _check(call, param, v, lambda: _call_query(call, param, v, loop), docs)

    door()


STORE_DOORS = store_doors(MongoStore)
MUTATING = {"commit", "save", "purge", "ack_outbox", "ack_spawn", "append_trace", "delete_timer"}


def _store_args(call: str, param: str, v: Any) -> dict[str, Any]:
    fn = getattr(MongoStore, call)
    args: dict[str, Any] = {}
    for name, p in list(inspect.signature(fn).parameters.items())[1:]:
        if name in NOT_DOORS:
            continue
        kind, default = _kind(call, name)
        if name == param:
            args[name] = _in_place(kind, v)
        elif kind == "exe":
            args[name] = Execution(id="scratch", definition_id="Order")
        elif p.default is inspect.Parameter.empty or name in ("within",):
            args[name] = default
    return args


@pytest.fixture(params=["sync", "async"])
def any_store(request: pytest.FixtureRequest, mongo_url: str, seeded: Any) -> Iterator[Any]:
    """The sync store, or the async one behind a blocking facade, on the seeded database."""
    db_name = seeded[0]
    if request.param == "sync":
        store: Any = MongoStore(pymongo.MongoClient(mongo_url), db_name)
        yield store
        store.close()
    else:
        facade = BlockingAsyncStore(lambda: AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db_name))
        yield facade
        facade.shutdown()


@pytest.mark.parametrize("call,param", STORE_DOORS, ids=[f"{c}-{p}" for c, p in STORE_DOORS])
def test_every_store_door_refuses_or_reads_literally(any_store: Any, client: Any, seeded: Any, call: str,
                                                     param: str) -> None:  # fmt: skip
    """Both stores, every method and parameter. A refused call leaves every stored document
    as it was; an accepted one on a method that writes may change only the document its
    literal value names."""
    db = client[seeded[0]]
    docs = _docs(db)

    @EXAMPLES
    @given(v=_values(call, param))
    def door(v: Any) -> None:
        before = {d["_id"]: d for d in db.harel_executions.find({})}
        args = _store_args(call, param, v)
        refused = []

        def run() -> Any:
            try:
                return getattr(any_store, call)(**args)
            except StoreConflict:
                raise
            except BaseException as exc:
                refused.append(exc)
                raise

        _check(call, param, v, run, docs)
        if refused or call not in MUTATING:
            after = {d["_id"]: d for d in db.harel_executions.find({})}
            assert after == before, f"{call}({param}={v!r}) changed stored documents"
        else:
            _restore(db, before)

    door()


def _restore(db: Any, before: dict[str, dict[str, Any]]) -> None:
    """Put the seeded documents back after an accepted write (the next example reads them)."""
    after = {d["_id"]: d for d in db.harel_executions.find({})}
    for i, d in after.items():
        if before.get(i) != d:
            db.harel_executions.delete_one({"_id": i})
            if i in before:
                db.harel_executions.insert_one(before[i])
    for i, d in before.items():
        if i not in after:
            db.harel_executions.insert_one(d)


SOAK = settings(max_examples=400, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip


@pytest.mark.soak
def test_every_query_door_at_length(seeded: Any, client: Any) -> None:
    """The query doors with many more examples, drawn afresh each run."""
    db_name, loop, _ = seeded
    docs = _docs(client[db_name])
    for call, param in query_doors():

        @SOAK
        @given(v=_values(call, param))
        def door(v: Any) -> None:
            _check(call, param, v, lambda: _call_query(call, param, v, loop), docs)

        door()
