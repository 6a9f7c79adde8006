"""Hostile values at every door, as a test layer: the test finds the doors itself (every public
query of `harel_beanie.queries`, every field of `ExecutionFilter`, every public method of both
stores, each of their parameters) and feeds each parameter the values of tests/support/hostile.py,
with the rule of `harel_beanie.core.arguments` as the oracle:

- refused: a TypeError or ValueError whose message names the parameter (and, for a store
  method, every stored document as it was);
- accepted: only a plain value of the type the parameter takes (a finite number, an int in
  range, a bool, a str BSON can hold, one of harel's statuses, one of the store's document
  classes), and the answer equals the literal lookup: the same question asked of the seeded
  documents in Python, with the value compared as it is.
- an accepted write changes only the documents its literal arguments name and, for the
  writes tests/support/write_model.py models (all but `commit`, held to its model by
  tests/doors/test_write_oracle.py), leaves the whole database exactly as the model says.

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
from harel_beanie.core.counting import COUNTED, COUNTED_SEQ, DIRTY
from harel_beanie.core.documents import NODE_COUNTER_ID, ExecutionDocument, bind
from harel_beanie.core.keys import encode_path
from harel_beanie.core.partitions import DEFAULT_PARTITIONS
from harel_beanie.core.seqs import lease_id
from tests.support import write_model
from tests.support.both import BlockingAsyncStore
from tests.support.hostile import hostile
from tests.support.mutation import mutated
from tests.support.seeds import HOSTILE_IDS, NOW

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
    "fold": ("bool", True),
    "parts": ("parts", None),
    "ids": ("ids", None),
    "build_batches": ("count0-or-none", None),
    "build_batch": ("count0-or-none", None),
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
    ("stuck", "after"): ("seconds", 300.0),  # the threshold, not a cursor
    ("backlog", "timers"): ("count0", 10),  # the next timers listed (None: as many as `show`)
    ("backlog", "entries"): ("bool", True),
    ("backlog", "oldest"): ("count0", 5),  # the holders of the oldest entries listed, of each kind
}
#: store methods that only open or close it
LIFECYCLE = {"init", "close"}
EXECUTIONS, COUNTERS, COUNTS = "harel_executions", "harel_counters", "harel_hb_counts"


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
    unknown = [
        (c, p)
        for c, p in query_doors() + store_doors(MongoStore) + store_doors(AsyncMongoStore)
        if p not in KINDS and (c, p) not in OVERRIDES
    ]
    assert not unknown, f"give these parameters a kind in tests/support/doors/test_hostile_values.py: {unknown}"
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
        "count0-or-none": lambda v: (
            v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= INT64_MAX)
        ),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and INT64_MIN <= v <= INT64_MAX,
        "bool": lambda v: isinstance(v, bool),
        "status": lambda v: isinstance(v, Status) or (isinstance(v, str) and v in queries.STATUSES),
        "statuses": lambda v: (
            isinstance(v, (list, tuple, set, frozenset))
            and all(isinstance(s, Status) or s in queries.STATUSES for s in v)
        ),
        "parts": lambda v: (
            v is None
            or (
                isinstance(v, (list, tuple))
                and all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < DEFAULT_PARTITIONS for n in v)
            )
        ),
        "ids": lambda v: v is None or (isinstance(v, (list, tuple)) and all(plain("str", s) for s in v)),
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
    from tests.support.seeds import seed_everything

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


EXAMPLES = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


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
MUTATING = {
    "commit",
    "save",
    "purge",
    "ack_outbox",
    "ack_spawn",
    "append_trace",
    "delete_timer",
    "fold_counts",
    "due_timers",  # it raises a stale `next_fire` bound as it reads
}


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
        store._state.clock = lambda: PINNED  # a tombstone's time: what the exact oracle expects
        yield store
        store.close()
    else:
        facade = BlockingAsyncStore(lambda: AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db_name))
        facade.inner._state.clock = lambda: PINNED
        yield facade
        facade.shutdown()


def snapshot(db: Any) -> dict[str, dict[Any, dict[str, Any]]]:
    """Every document of every collection of the database, by collection and `_id`."""
    return {name: {d["_id"]: d for d in db[name].find({})} for name in db.list_collection_names()}


def _literal_id(v: Any) -> str:
    return str.__str__(v)  # what a str subclass names: its text, whatever its __eq__ says


def named(call: str, args: dict[str, Any], before: dict[str, dict[Any, dict[str, Any]]]) -> dict[tuple[str, Any], Any]:
    """The documents an accepted write may change: the ones its literal arguments name, in the
    collections the method writes. Each maps to a check of the document it may become (None:
    any content), so a named document changed beyond its method's job is caught too."""
    exes = before.get(EXECUTIONS, {})
    if call in ("commit", "save"):  # the execution (the seq mint's own documents aside: `_mint`)
        return {(EXECUTIONS, _literal_id(args["exe"].id)): None}
    if call in ("append_trace", "delete_timer"):
        return {(EXECUTIONS, _literal_id(args["execution_id"])): None}
    if call in ("ack_outbox", "ack_spawn"):
        array = "outbox" if call == "ack_outbox" else "spawns"
        seq = args["seq"]
        return {
            (EXECUTIONS, i): _without(array, lambda e: e.get("seq") == seq)
            for i, d in exes.items()
            if any(e.get("seq") == seq for e in d.get(array) or ())
        }
    if call == "purge":  # the tombstone, and the entries other executions addressed to it
        target = _literal_id(args["execution_id"])
        holders = {
            (EXECUTIONS, i): _without("outbox", lambda e: e.get("target_id") == target)
            for i, d in exes.items()
            if any(e.get("target_id") == target for e in d.get("outbox") or ())
        }
        return {**holders, (EXECUTIONS, target): None, (COUNTERS, "trace:" + target): None}
    if call == "fold_counts":  # the counters, and the counts' bookkeeping of the executions named
        ids = args.get("ids")
        exes = before.get(EXECUTIONS, {})
        folded = {i: _only_counting for i in exes if ids is None or i in ids}
        return {
            **{(COUNTS, n): None for n in range(DEFAULT_PARTITIONS)},
            **{(EXECUTIONS, i): f for i, f in folded.items()},
        }
    if call == "due_timers":  # the documents its bound brings in
        now = args["now"]
        return {
            (EXECUTIONS, i): None
            for i, d in exes.items()
            if isinstance(d.get("next_fire"), (int, float)) and d["next_fire"] <= now
        }
    raise AssertionError(f"no oracle for the write {call}: say which documents it may change")


def _only_counting(before: dict[str, Any], after: Any) -> bool:
    """A fold touches nothing of an execution but the counts' bookkeeping (`quiet` is its
    mark too: core.stuck)."""
    bookkeeping = {DIRTY, COUNTED, COUNTED_SEQ, "quiet"}
    keep = lambda d: {k: v for k, v in (d or {}).items() if k not in bookkeeping}
    return after is not None and keep(before) == keep(after)


def _without(array: str, gone: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any], Any], bool]:
    """A holder of entries may lose exactly the entries named, nothing else of its array."""

    def check(before: dict[str, Any], after: Any) -> bool:
        kept = [e for e in before.get(array) or () if not gone(e)]
        return after is not None and list(after.get(array) or ()) == kept

    return check


#: the seq mint's node counter and node leases: the store instance's own bookkeeping, which a
#: commit takes before it reads its arguments (as its first commit would anyway), never caller data
MINT = {(COUNTERS, NODE_COUNTER_ID)} | {(COUNTERS, lease_id(n)) for n in range(1024)}  # 10-bit nodes


def changes(
    before: dict[str, dict[Any, Any]], after: dict[str, dict[Any, Any]], *, mint: bool = False
) -> dict[tuple[str, Any], Any]:
    """Each document added, removed or changed, by collection and `_id`, with what it became;
    the seq mint's documents only when `mint`."""
    out: dict[tuple[str, Any], Any] = {}
    for coll in before.keys() | after.keys():
        was, now = before.get(coll, {}), after.get(coll, {})
        out.update({(coll, i): now.get(i) for i in was.keys() | now.keys() if was.get(i) != now.get(i)})
    return out if mint else {k: v for k, v in out.items() if k not in MINT}


def write_oracle(call: str, args: dict[str, Any], before: dict[str, Any], after: dict[str, Any]) -> None:
    """Fail unless an accepted write changed only what `named` allows, as it allows, and,
    for a write the reference models of tests/support/write_model.py cover, unless the whole
    database after it is exactly the model's."""
    allowed = named(call, args, before)
    stray = {k: v for k, v in changes(before, after).items() if k not in allowed}
    assert not stray, f"{call}({_shown(args)}) changed documents it does not name: {sorted(map(repr, stray))[:10]}"
    for (coll, i), fits in allowed.items():
        was, now = before.get(coll, {}).get(i), after.get(coll, {}).get(i)
        if fits is not None and was is not None and was != now:
            assert fits(was, now), f"{call}({_shown(args)}) changed {coll}/{i!r} beyond its job: {now!r}"[:2000]
    expected = exact(call, args, before)
    if expected is not None:
        write_model.expect_equal(f"{call}({_shown(args)})", expected, after)


#: the store's pinned wall clock in this layer (a purge's tombstone time)
PINNED = 1_800_000_000.5
#: the trace ring of a store with the default settings (`trace_max` 200)
DEFAULT_RING = 200


def exact(call: str, args: dict[str, Any], before: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The whole database after an accepted write, by its reference model, with each value
    as the literal it is used as (a `str` subclass is its text); None for a commit, which
    tests/doors/test_write_oracle.py holds to its model with the seqs its mint handed out."""
    text = lambda v: str.__str__(v)  # noqa: E731 - the one conversion, named
    if call == "purge":
        return write_model.purge(before, text(args["execution_id"]), int(args["expected_version"]), PINNED)[0]
    if call in ("ack_outbox", "ack_spawn"):
        return write_model.ack(before, "outbox" if call == "ack_outbox" else "spawns", int(args["seq"]))
    if call == "delete_timer":
        key = encode_path(text(args["path"]))
        return write_model.delete_timer(before, text(args["execution_id"]), key, args["fire_at"])
    if call == "append_trace":
        return write_model.append_trace(before, text(args["execution_id"]), args["entry"], DEFAULT_RING)
    if call == "due_timers":
        return write_model.due_timers(before, args["now"])
    if call == "fold_counts":
        ids = args.get("ids")
        parts = args.get("parts")
        return write_model.fold(before, parts, None if ids is None else [text(i) for i in ids])[0]
    return None


def _shown(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items())[:300]


def restore(db: Any, before: dict[str, dict[Any, dict[str, Any]]]) -> None:
    """Put the whole database back as it was (the next example reads it), but for the seq
    mint's leases, which the store instance keeps holding."""
    after = snapshot(db)
    for (coll, i), _ in changes(before, after).items():
        db[coll].delete_one({"_id": i})
        if i in before.get(coll, {}):
            db[coll].insert_one(before[coll][i])


def run_store_door(store: Any, db: Any, call: str, param: str, docs: list[dict[str, Any]], examples: Any) -> None:
    """One door of a store fed the hostile values: a refused call leaves the whole database
    as it was; an accepted one on a method that writes changes only what `named` allows."""

    writes = call in MUTATING

    @examples
    @given(v=_values(call, param))
    def door(v: Any) -> None:
        if not writes:  # a read: the whole door is compared once, below
            _check(call, param, v, lambda: getattr(store, call)(**_store_args(call, param, v)), docs)
            return
        before = snapshot(db)
        args = _store_args(call, param, v)
        refused = []

        def run() -> Any:
            try:
                return getattr(store, call)(**args)
            except StoreConflict:
                raise
            except BaseException as exc:
                refused.append(exc)
                raise

        try:
            _check(call, param, v, run, docs)
            after = snapshot(db)
            if refused:
                assert changes(before, after) == {}, f"{call}({param}={v!r}) was refused but changed documents"
            else:
                write_oracle(call, args, before, after)
        finally:
            restore(db, before)

    untouched = snapshot(db)
    door()
    if not writes:
        assert changes(untouched, snapshot(db)) == {}, f"{call}, a read, changed stored documents"


@pytest.mark.parametrize("call,param", STORE_DOORS, ids=[f"{c}-{p}" for c, p in STORE_DOORS])
def test_every_store_door_refuses_or_reads_literally(
    any_store: Any, client: Any, seeded: Any, call: str, param: str
) -> None:
    """Both stores, every method and parameter. A refused call leaves every document of the
    database as it was; an accepted write changes only the documents its literal arguments
    name (`named`), in the collections its method writes."""
    db = client[seeded[0]]
    run_store_door(any_store, db, call, param, _docs(db), EXAMPLES)


class GreedyPurgeStore(MongoStore):
    """A planted fault: a purge that also deletes every other execution of its definition."""

    def purge(self, execution_id: str, expected_version: int) -> bool:
        purged = super().purge(execution_id, expected_version)
        if purged:
            self._exes.delete_many({"_id": {"$ne": execution_id}, "definition_id": "Hostile"})
        return purged


def test_the_write_oracle_catches_a_purge_that_deletes_other_executions(
    mongo_url: str, client: Any, seeded: Any
) -> None:
    """The oracle can fail: the same layer run on a store whose purge also deletes other
    executions finds it (a layer that only restored the database after an accepted write
    passed such a store), and the database is left as it was seeded."""
    db = client[seeded[0]]
    greedy = GreedyPurgeStore(pymongo.MongoClient(mongo_url), seeded[0])
    before = snapshot(db)
    try:
        with pytest.raises(AssertionError, match="changed documents it does not name"):
            run_store_door(greedy, db, "purge", "execution_id", _docs(db), EXAMPLES)
    finally:
        greedy.close()
    assert changes(before, snapshot(db)) == {}


def test_the_write_oracle_catches_a_purge_that_corrupts_its_own_tombstone(
    mongo_url: str, client: Any, seeded: Any
) -> None:
    """The exact part of the oracle can fail where the named-documents part cannot: a purge
    that drops the creations its tombstone buries changes only the document it names."""
    from harel_beanie.core.flows import purging

    db = client[seeded[0]]
    store = MongoStore(pymongo.MongoClient(mongo_url), seeded[0])
    store._state.clock = lambda: PINNED
    before = snapshot(db)
    try:
        with mutated(purging, "purge", '"buried": buried, "by"', '"buried": [], "by"'):
            with pytest.raises(AssertionError, match="not what its model says"):
                run_store_door(store, db, "purge", "execution_id", _docs(db), EXAMPLES)
    finally:
        store.close()
    assert changes(before, snapshot(db)) == {}


SOAK = settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


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
