"""Bad input, fuzzed: every value a caller hands the store round-trips exactly through the
real server, or is refused with TypeError/ValueError, and a refused call never leaves a
stored document half-written.

The store's answer to a lone surrogate (a str MongoDB cannot store: BSON strings are UTF-8)
is to refuse it with a ValueError before anything is sent. Inside the JSON the store keeps
as text (spawn contexts, trace steps) a surrogate is escaped and round-trips.

Each property runs on both stores (the async one behind a blocking facade) against the real
server, with a small budget by default; the `_soak` variants run the same properties with
a large one (`make soak`).
"""

from __future__ import annotations

import base64
import json
import math
import uuid
from typing import Any, Iterator, Optional

import pymongo
import pytest
from harel.engine.execution import Execution
from harel.engine.store.base import TimerOp
from harel.spec.states import Event
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.core.keys import decode_path
from harel_beanie.core.listing import decode_cursor
from tests.support.both import BlockingAsyncStore
from tests.support.fuzz_strategies import (
    any_text,
    clean_text,
    close_ids,
    fire_time,
    has_surrogate,
    json_value,
    not_a_str,
    not_an_int,
)

FAST = settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
SOAK = settings(max_examples=1500, deadline=None, database=None, suppress_health_check=list(HealthCheck))
FAR = 1e300  # a sweep time after every fire time (the store takes only finite ones)


class World:
    """Both stores on one database of their own, and a raw view of it."""

    def __init__(self, url: str, client: pymongo.MongoClient[Any]) -> None:
        self.db = "hbz_" + uuid.uuid4().hex[:10]
        self.client = client
        self.coll = client[self.db]["harel_executions"]
        self.figures: Any = None  # the running test's (tests/support/figures.py)
        self.stores = {
            "sync": MongoStore(pymongo.MongoClient(url), self.db),
            "async": BlockingAsyncStore(lambda: AsyncMongoStore(pymongo.AsyncMongoClient(url), self.db)),
        }

    def fresh(self, kind: str, what: str) -> Any:
        """The store of `kind` over an emptied collection; counted as one example (of
        `what`) in the running test's figures."""
        if self.figures is not None:
            self.figures.add(examples=1, **{"examples " + kind: 1})
        self.coll.delete_many({})
        return self.stores[kind]

    def raw(self) -> list[dict[str, Any]]:
        return sorted(self.coll.find({}), key=lambda d: d["_id"].encode("utf-8", "surrogatepass"))

    def close(self) -> None:
        self.stores["sync"].close()
        self.stores["async"].shutdown()
        self.client.drop_database(self.db)


@pytest.fixture(scope="module")
def world(mongo_url: str, client: pymongo.MongoClient[Any]) -> Iterator[World]:
    w = World(mongo_url, client)
    yield w
    w.close()


@pytest.fixture(autouse=True)
def _count_examples(request: pytest.FixtureRequest, figures: Any) -> Iterator[None]:
    """Each property counts the examples it ran into its own figures (docs/RELIABILITY.md)."""
    if "world" not in request.fixturenames:
        yield
        return
    world: World = request.getfixturevalue("world")
    world.figures = figures
    yield
    world.figures = None


kinds = st.sampled_from(["sync", "async"])


def refused(call: Any) -> Optional[BaseException]:
    """Run `call`; return the TypeError/ValueError it was refused with, None if it ran."""
    try:
        call()
    except (TypeError, ValueError) as err:
        return err
    return None


# --- 1. an execution and everything committed with it -------------------------------------


@st.composite
def commits(draw: st.DrawFn) -> dict[str, Any]:
    paths = draw(st.lists(any_text, max_size=3, unique=True))
    return dict(
        context=draw(st.dictionaries(any_text, json_value, max_size=4)),
        event=dict(
            id=draw(any_text), kind=draw(any_text), data=draw(st.dictionaries(any_text, json_value, max_size=3))
        ),
        target=draw(st.one_of(st.none(), any_text)),
        processed=draw(st.one_of(st.none(), any_text)),
        timers=[(p, draw(fire_time)) for p in paths],
        spawn=(draw(any_text), draw(any_text), draw(st.dictionaries(any_text, json_value, max_size=3))),
        trace=draw(st.one_of(st.none(), st.dictionaries(any_text, json_value, max_size=3))),
    )


def storable(c: dict[str, Any], *also: Any) -> bool:
    """Whether the server can hold it: no lone surrogate anywhere it is stored as a BSON
    string. The spawn context and the trace step are kept as JSON text, which escapes one."""
    return not has_surrogate(
        [c["context"], c["event"], c["target"], c["processed"], [p for p, _ in c["timers"]], c["spawn"][:2], *also]
    )


def commit_args(c: dict[str, Any]) -> dict[str, Any]:
    return dict(
        emits=[(c["target"], Event(**c["event"]))],
        processed_event_id=c["processed"],
        timers=tuple(TimerOp("schedule", p, at) for p, at in c["timers"]),
        spawns=(c["spawn"],),
        trace=c["trace"],
    )


def check_landed(store: Any, exe: Execution, c: dict[str, Any], version: int) -> None:
    loaded = store.load(exe.id)
    assert loaded.model_dump(mode="json") == exe.model_dump(mode="json") and loaded.version == version
    if c["processed"] is not None:
        assert store.is_processed(exe.id, c["processed"])
        assert store.load_for_event(exe.id, c["processed"])[1] is True
    outbox = store.pending_outbox()
    assert (outbox[-1].target_id, outbox[-1].event.model_dump(mode="json")) == (
        c["target"],
        Event(**c["event"]).model_dump(mode="json"),
    )
    spawn = store.pending_spawns()[-1]
    assert (spawn.parent_id, spawn.child_id, spawn.root_path, spawn.context) == (exe.id, *c["spawn"])
    due = store.due_timers(FAR)
    for path, at in c["timers"]:
        assert (exe.id, path, at) in due
    if c["trace"] is not None:
        step = store.read_trace(exe.id)[-1]
        assert step == {**c["trace"], "index": c["trace"].get("index", version - 1)}


def execution_property(
    world: World, kind: str, exe_id: str, definition_id: str, first: dict[str, Any], second: dict[str, Any]
) -> None:
    store = world.fresh(kind, "executions")
    exe = Execution(id=exe_id, definition_id=definition_id, context=first["context"])
    err = refused(lambda: store.commit(exe, **commit_args(first)))
    if not storable(first, exe_id, definition_id):
        assert err is not None, "a lone surrogate was accepted"
        assert world.raw() == [] and exe.version == 0
        return
    assert err is None, err
    check_landed(store, exe, first, 1)
    # a second commit on the stored execution: an update, with its own values
    before = world.raw()
    exe.context = second["context"]
    err = refused(lambda: store.commit(exe, **commit_args(second)))
    if not storable(second):
        assert err is not None, "a lone surrogate was accepted"
        assert world.raw() == before and exe.version == 1, "a refused commit changed the document"
        return
    assert err is None, err
    check_landed(store, exe, second, 2)
    assert [r.id for r in store.list_executions(definition_id=definition_id).items] == [exe_id]
    assert exe_id in store.ids_with_prefix(exe_id)
    assert [s.id for s in store.list_executions().items] == [exe_id]


@FAST
@given(kind=kinds, exe_id=any_text, definition_id=any_text, first=commits(), second=commits())
def test_fuzz_executions_round_trip_or_are_refused_whole(world, kind, exe_id, definition_id, first, second):
    """Execution id, definition id, context keys and values, event id/kind/payload, emit
    target, processed id, timer paths, spawn child/root/context and trace step, through the
    creation (insert) and a second commit (update): all round-trip exactly (load, dedupe,
    outbox, spawns, timers, trace, listing by definition, prefix search), or the commit is
    refused with a ValueError and the stored document is exactly as before."""
    execution_property(world, kind, exe_id, definition_id, first, second)


@pytest.mark.soak
@SOAK
@given(kind=kinds, exe_id=any_text, definition_id=any_text, first=commits(), second=commits())
def test_fuzz_executions_round_trip_or_are_refused_whole_soak(world, kind, exe_id, definition_id, first, second):
    """The execution round-trip property with the soak's budget of examples."""
    execution_property(world, kind, exe_id, definition_id, first, second)


# --- 2. timer paths through schedule, cancel, sweep and delete ----------------------------


@st.composite
def timer_plans(draw: st.DrawFn) -> dict[str, Any]:
    paths = draw(st.lists(clean_text, min_size=1, max_size=6, unique=True))
    return dict(
        armed={p: draw(fire_time) for p in paths},
        cancel=draw(st.lists(st.sampled_from(paths), unique=True)),
        now=draw(fire_time),
        wrong=draw(fire_time),
    )


def timers_property(world: World, kind: str, plan: dict[str, Any]) -> None:
    store = world.fresh(kind, "timer paths")
    exe = Execution(id="t", definition_id="d")
    store.commit(exe, [], timers=tuple(TimerOp("schedule", p, at) for p, at in plan["armed"].items()))
    model = dict(plan["armed"])
    store.commit(exe, [], timers=tuple(TimerOp("cancel", p) for p in plan["cancel"]))
    for p in plan["cancel"]:
        del model[p]
    doc = world.raw()[0]
    for key in doc.get("timers", {}):  # a field name the server takes as one plain key
        assert "." not in key and not key.startswith("$") and "\x00" not in key and key
    assert {decode_path(k): at for k, at in doc.get("timers", {}).items()} == model
    due = store.due_timers(plan["now"])
    assert sorted(due) == sorted(("t", p, at) for p, at in model.items() if at <= plan["now"])
    assert [at for _, _, at in due] == sorted(at for _, _, at in due)
    for _, path, at in due:
        if plan["wrong"] != at:
            store.delete_timer("t", path, plan["wrong"])  # a stale fire time removes nothing
        store.delete_timer("t", path, at)
        del model[path]
    doc = world.raw()[0]
    assert {decode_path(k): at for k, at in doc.get("timers", {}).items()} == model
    if model:
        assert doc["next_fire"] <= min(model.values())
    assert sorted(store.due_timers(FAR)) == sorted(("t", p, at) for p, at in model.items())


@FAST
@given(kind=kinds, plan=timer_plans())
def test_fuzz_timer_paths_round_trip_through_their_lifecycle(world, kind, plan):
    """Schedule, cancel, sweep, a stale delete, delete: the stored keys are plain field names,
    decode to the paths, and `next_fire` never hides an armed timer."""
    timers_property(world, kind, plan)


@pytest.mark.soak
@SOAK
@given(kind=kinds, plan=timer_plans())
def test_fuzz_timer_paths_round_trip_through_their_lifecycle_soak(world, kind, plan):
    """The timer-path property with the soak's budget of examples."""
    timers_property(world, kind, plan)


# --- 3. listing: keyset pages over awkward ids, and foreign cursors ------------------------


def listing_property(world: World, kind: str, ids: set[str], page: int, by_definition: bool) -> None:
    store = world.fresh(kind, "listing")
    for i, exe_id in enumerate(sorted(ids)):
        store.save(Execution(id=exe_id, definition_id=f"d{i % 2}"))
    wanted = sorted(i for n, i in enumerate(sorted(ids)) if not by_definition or n % 2 == 0)
    got: list[str] = []
    cursor = None
    while True:
        result = store.list_executions(limit=page, cursor=cursor, definition_id="d0" if by_definition else None)
        got += [r.id for r in result.items]
        if result.next_cursor is None:
            break
        assert decode_cursor(result.next_cursor) == got[-1]
        cursor = result.next_cursor
    assert got == wanted  # code point order, every id once


@FAST
@given(kind=kinds, ids=st.sets(close_ids, max_size=10), page=st.integers(1, 4), by_definition=st.booleans())
def test_fuzz_listing_pages_every_id_once_in_order(world, kind, ids, page, by_definition):
    """Keyset pages over awkward ids, with and without a definition filter: every id once, in
    code point order."""
    listing_property(world, kind, ids, page, by_definition)


@pytest.mark.soak
@SOAK
@given(kind=kinds, ids=st.sets(close_ids, max_size=30), page=st.integers(1, 7), by_definition=st.booleans())
def test_fuzz_listing_pages_every_id_once_in_order_soak(world, kind, ids, page, by_definition):
    """The listing property with the soak's budget of examples."""
    listing_property(world, kind, ids, page, by_definition)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode()


cursors = st.one_of(
    any_text,
    st.binary(max_size=24).map(b64),
    json_value.map(lambda v: b64(json.dumps(v).encode())),
    json_value.map(lambda v: b64(json.dumps({"after": v}).encode())),
    any_text.map(lambda s: b64(json.dumps({"after": s}).encode())),
)


def cursor_property(world: World, kind: str, cursor: str) -> None:
    store = world.fresh(kind, "cursors")
    ids = ["", "a", "a.b", "b", "\U0010ffff"]
    for i in ids:
        store.save(Execution(id=i, definition_id="d"))
    before = world.raw()
    try:
        page = store.list_executions(cursor=cursor, limit=10)
    except (TypeError, ValueError):
        assert world.raw() == before
        return
    after = decode_cursor(cursor)  # it was accepted: it names an id to start after
    assert [r.id for r in page.items] == sorted(i for i in ids if after is None or i > after)


@FAST
@given(kind=kinds, cursor=cursors)
def test_fuzz_foreign_cursors_are_refused_or_start_after_their_id(world, kind, cursor):
    """Any cursor is refused with a ValueError/TypeError, or names an id and the page starts
    after it; nothing is written."""
    cursor_property(world, kind, cursor)


@pytest.mark.soak
@SOAK
@given(kind=kinds, cursor=cursors)
def test_fuzz_foreign_cursors_are_refused_or_start_after_their_id_soak(world, kind, cursor):
    """The cursor property with the soak's budget of examples."""
    cursor_property(world, kind, cursor)


# --- 4. the id-prefix search ----------------------------------------------------------------


def prefix_property(world: World, kind: str, ids: set[str], prefixes: list[str]) -> None:
    store = world.fresh(kind, "prefixes")
    for i in ids:
        store.save(Execution(id=i, definition_id="d"))
    for p in prefixes + [i[:n] for i in sorted(ids)[:3] for n in range(len(i) + 1)]:
        if has_surrogate(p):
            assert refused(lambda p=p: store.ids_with_prefix(p)) is not None
            continue
        assert sorted(store.ids_with_prefix(p)) == sorted(i for i in ids if i.startswith(p)), repr(p)


@FAST
@given(kind=kinds, ids=st.sets(close_ids, max_size=10), prefixes=st.lists(st.one_of(close_ids, any_text), max_size=4))
def test_fuzz_id_prefix_search_matches_literally(world, kind, ids, prefixes):
    """`ids_with_prefix` equals `str.startswith` for every drawn prefix."""
    prefix_property(world, kind, ids, prefixes)


@pytest.mark.soak
@SOAK
@given(kind=kinds, ids=st.sets(close_ids, max_size=30), prefixes=st.lists(st.one_of(close_ids, any_text), max_size=8))
def test_fuzz_id_prefix_search_matches_literally_soak(world, kind, ids, prefixes):
    """The prefix property with the soak's budget of examples."""
    prefix_property(world, kind, ids, prefixes)


# --- 5. values of the wrong type, anywhere ------------------------------------------------

WRONG_TYPE_CALLS = {
    "load": lambda s, v: s.load(v),
    "is_processed id": lambda s, v: s.is_processed(v, "ev"),
    "is_processed event": lambda s, v: s.is_processed("x", v),
    "load_for_event id": lambda s, v: s.load_for_event(v, "ev"),
    "load_for_event event": lambda s, v: s.load_for_event("x", v),
    "read_trace": lambda s, v: s.read_trace(v),
    "append_trace": lambda s, v: s.append_trace(v, {"a": 1}),
    "ids_with_prefix": lambda s, v: s.ids_with_prefix(v),
    "delete_timer id": lambda s, v: s.delete_timer(v, "T", 5.0),
    "delete_timer path": lambda s, v: s.delete_timer("x", v, 5.0),
    "list definition": lambda s, v: s.list_executions(definition_id=v),
    "list cursor": lambda s, v: s.list_executions(cursor=v),
    "purge id": lambda s, v: s.purge(v, 1),
    "commit processed": lambda s, v: s.commit(s.load("x"), [], processed_event_id=v),
    "commit target": lambda s, v: s.commit(s.load("x"), [(v, Event(kind="A"))]),
    "commit child": lambda s, v: s.commit(s.load("x"), [], spawns=((v, "R", {}),)),
    "commit root": lambda s, v: s.commit(s.load("x"), [], spawns=(("c", v, {}),)),
    "commit timer path": lambda s, v: s.commit(s.load("x"), [], timers=(TimerOp("schedule", v, 1.0),)),
}
WRONG_INT_CALLS = {
    "ack_outbox": lambda s, v: s.ack_outbox(v),
    "ack_spawn": lambda s, v: s.ack_spawn(v),
    "purge version": lambda s, v: s.purge("x", v),
}


def wrong_type_property(world: World, kind: str, call: Any, value: Any) -> None:
    store = world.fresh(kind, "wrong types")
    exe = Execution(id="x", definition_id="d")
    store.commit(
        exe,
        [("x", Event(kind="A"))],
        processed_event_id="ev",
        timers=(TimerOp("schedule", "T", 5.0),),
        spawns=(("k", "R", {}),),
    )
    before = world.raw()
    assert refused(lambda: call(store, value)) is not None, f"{value!r} was accepted"
    assert world.raw() == before


wrong_calls = st.one_of(
    st.tuples(st.sampled_from(list(WRONG_TYPE_CALLS.values())), not_a_str),
    st.tuples(st.sampled_from(list(WRONG_INT_CALLS.values())), not_an_int),
)


@FAST
@given(kind=kinds, case=wrong_calls)
def test_fuzz_values_of_the_wrong_type_are_refused_and_change_nothing(world, kind, case):
    """A non-str where a str goes, a non-int where an int goes (operators, bools, floats,
    bytes, lists): refused, nothing written."""
    wrong_type_property(world, kind, *case)


@pytest.mark.soak
@SOAK
@given(kind=kinds, case=wrong_calls)
def test_fuzz_values_of_the_wrong_type_are_refused_and_change_nothing_soak(world, kind, case):
    """The wrong-type property with the soak's budget of examples."""
    wrong_type_property(world, kind, *case)


# --- 6. lone surrogates, one argument at a time -----------------------------------------

S = "bad\ud800"
SURROGATE_CALLS = {
    "execution id": lambda s: s.commit(Execution(id=S, definition_id="d"), []),
    "definition id": lambda s: s.commit(Execution(id="n", definition_id=S), []),
    "context": lambda s: s.commit(Execution(id="n", definition_id="d", context={"k": S}), []),
    "processed event id": lambda s: s.commit(s.load("x"), [], processed_event_id=S),
    "emit target": lambda s: s.commit(s.load("x"), [(S, Event(kind="A"))]),
    "event payload": lambda s: s.commit(s.load("x"), [("x", Event(kind="A", data={S: 1}))]),
    "spawn child id": lambda s: s.commit(s.load("x"), [], spawns=((S, "R", {}),)),
    "timer path": lambda s: s.commit(s.load("x"), [], timers=(TimerOp("schedule", S, 1.0),)),
    "load": lambda s: s.load(S),
    "id prefix": lambda s: s.ids_with_prefix(S),
    "is_processed": lambda s: s.is_processed("x", S),
    "delete_timer path": lambda s: s.delete_timer("x", S, 5.0),
    "list definition": lambda s: s.list_executions(definition_id=S),
    "purge": lambda s: s.purge(S, 1),
}


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("call", list(SURROGATE_CALLS.values()), ids=list(SURROGATE_CALLS))
def test_a_lone_surrogate_is_refused_before_anything_is_written(world, kind, call):
    """A lone surrogate (BSON strings are UTF-8 and cannot hold one) in each argument, on
    either store: a ValueError before anything is sent, every stored document unchanged."""
    store = world.fresh(kind, "surrogates")
    store.commit(Execution(id="x", definition_id="d"), [], timers=(TimerOp("schedule", "T", 5.0),))
    before = world.raw()
    with pytest.raises(ValueError, match="surrogate"):
        call(store)
    assert world.raw() == before


#: the argument each case's message names (the parameter, and the part of it that held the value)
NAMED = {
    "execution id": "exe.id",
    "timer path": "timers[].path",
    "processed event id": "processed_event_id",
    "emit target": "emits[].target",
    "id prefix": "prefix",
}


@pytest.mark.parametrize("what", list(NAMED))
def test_a_lone_surrogate_is_refused_naming_the_argument(world, what):
    """The ValueError for a lone surrogate names the argument that held it."""
    store = world.fresh("sync", "surrogates")
    store.commit(Execution(id="x", definition_id="d"), [])
    with pytest.raises(ValueError) as err:
        SURROGATE_CALLS[what](store)
    assert NAMED[what] in str(err.value)


# --- 7. numbers the store cannot keep -----------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_nan_timer_is_refused_and_never_hides_other_timers(world, kind):
    """A NaN fire time is refused, and the execution's other timers still come due (a NaN
    `next_fire` would match no sweep)."""
    store = world.fresh(kind, "numbers")
    exe = Execution(id="n", definition_id="d")
    store.commit(exe, [])
    err = refused(lambda: store.commit(exe, [], timers=(TimerOp("schedule", "Bad", math.nan),)))
    store.commit(exe, [], timers=(TimerOp("schedule", "Good", 5.0),))
    assert err is not None
    assert store.due_timers(10.0) == [("n", "Good", 5.0)]


@pytest.mark.parametrize("where", ["context", "event data"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_numbers_round_trip_or_are_refused(world, where, value):
    """A NaN or an infinity in a context or an event's data round-trips as itself or is refused
    with nothing written, never stored as `null`."""
    store = world.fresh("sync", "numbers")
    payload = {"v": value}
    exe = Execution(id="n", definition_id="d", context=payload if where == "context" else {})
    emits = [("n", Event(kind="A", data=payload))] if where == "event data" else []
    if refused(lambda: store.commit(exe, emits)) is not None:
        assert world.raw() == []
        return
    got = store.load("n").context if where == "context" else store.pending_outbox()[0].event.data
    assert got["v"] == value or (math.isnan(value) and isinstance(got["v"], float) and math.isnan(got["v"]))


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.ack_outbox(2**63),
        lambda s: s.ack_spawn(-(2**63) - 1),
        lambda s: s.purge("x", 2**64),
        lambda s: s.list_executions(limit=2**63),
    ],
    ids=["ack_outbox", "ack_spawn", "purge", "limit"],
)
def test_an_int_beyond_int64_is_refused_with_a_value_error(world, call):
    """An int outside int64 as a seq, a version or a limit is refused with a
    TypeError/ValueError and nothing is written."""
    store = world.fresh("sync", "numbers")
    store.commit(Execution(id="x", definition_id="d"), [])
    before = world.raw()
    with pytest.raises((TypeError, ValueError)):
        call(store)
    assert world.raw() == before
