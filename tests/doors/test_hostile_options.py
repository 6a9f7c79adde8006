"""Hostile values at every constructor, option and flag, found by enumeration (tests/support/doors.py):
every class, constructor, classmethod, method and function of every public path, and every
flag of every command, read from the command line's own parsers.

The rule is `harel_beanie.core.arguments`': a value of the wrong type or range is refused with
a TypeError/ValueError whose message names the argument. A bool is not an int, a float is not
an int where an int is meant, "5" is not a number, NaN is not a number, a dict is not a str.
Leases, parks and waits are bounded: a claim's visibility at most a day, a nack's delay at most
a week, an idle wait at most an hour (`MongoStore(trace_max=True)` used to be accepted,
`trace_max="5"` raised a TypeError not naming it, `claim(visibility=1e308)` leased a group for
ever, and `dashboard_router(page_size=2.5)` was coerced with `int()`).

A door added later is tried without anyone listing it: `test_every_door_can_be_called` fails
until this file says how to call it, and tests/support/doors.py says what each parameter takes.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import mongomock
import pymongo
import pytest
from harel.spec.states import Event
from mongomock_motor import AsyncMongoMockClient

from harel_beanie import AsyncMongoStore, AsyncMongoTransport, HistoryWriter, MongoStore, MongoTransport, RetryPolicy
from harel_beanie.commands.cli import main as cli_main
from harel_beanie.core.limits import MAX_IDLE_WAIT, MAX_PARK, MAX_POLL_INTERVAL, MAX_VISIBILITY
from harel_beanie.dashboard import no_auth
from harel_beanie.transport.queues import MAX_PREFETCH
from tests.support.doors import NOT_VALUES, Door, cli_flags, doors

OP = {"$gt": 0}
#: values of the wrong type for each kind: each must be refused naming the argument
WRONG: dict[str, list[Any]] = {
    "int": [True, False, 2.5, 5.0, "5", OP, [1], b"1", 2**70, -(2**70)],
    "number": [True, "5", "1.5", OP, [1.0], b"1", math.nan],
    "bool": [1, 0, "true", "", OP, [True]],
    "str": [5, 2.5, True, OP, ["x"], b"x", ("x",)],
    "object": [{"kind": "A"}, "x", 5, [1]],
}
#: the leases, parks and waits, with their bound: a value above it is refused naming it
BOUNDED = {
    "MongoTransport.claim.visibility": MAX_VISIBILITY,
    "AsyncMongoTransport.claim.visibility": MAX_VISIBILITY,
    "MongoTransport.claim_many.visibility": MAX_VISIBILITY,
    "AsyncMongoTransport.claim_many.visibility": MAX_VISIBILITY,
    "MongoTransport.claim_many.k": MAX_PREFETCH,
    "AsyncMongoTransport.claim_many.k": MAX_PREFETCH,
    "AsyncMongoTransport.__init__.prefetch": MAX_PREFETCH,
    "MongoTransport.nack.delay": MAX_PARK,
    "AsyncMongoTransport.nack.delay": MAX_PARK,
    "AsyncMongoTransport.__init__.idle_wait": MAX_IDLE_WAIT,
    "Worker.__init__.visibility": MAX_VISIBILITY,
    "Worker.__init__.idle_wait": MAX_IDLE_WAIT,
    "Worker.__init__.retain_every": 86400.0,
    "AsyncMongoTransport.__init__.poll_interval": MAX_POLL_INTERVAL,
    "RetryPolicy.__init__.delay": 3600.0,
    "RetryPolicy.overridden.delay": 3600.0,
    "MongoStore.from_url.retry_delay": 3600.0,
    "AsyncMongoStore.from_url.retry_delay": 3600.0,
}
#: numbers that may be infinite (harel sweeps every timer with inf)
INFINITE_OK: set[str] = set()
#: where a door's own checks are tried elsewhere, the reason
ELSEWHERE = {
    "queries": "every query and ExecutionFilter field: tests/support/doors/test_hostile_values.py (query_doors)",
}


def _value_doors() -> list[Door]:
    from harel_beanie import queries

    mine = []
    for d in doors():
        if d.kind is None:
            continue
        if getattr(queries, d.call.split(".")[0], None) is not None and d.call != "ExecutionFilter.query":
            continue  # ELSEWHERE["queries"]
        mine.append(d)
    return mine


VALUE_DOORS = _value_doors()

# --- how each door is called --------------------------------------------------------------


class Ctx:
    """What the calls need: the server's URL, a database of this test's, a scratch folder."""

    def __init__(self, url: str, db: str, tmp: Path) -> None:
        self.url, self.db, self.tmp = url, db, tmp
        self.n = 0

    def fresh(self) -> str:
        self.n += 1
        return f"p{self.n}"


QUICK = RetryPolicy(attempts=1, delay=0.0, timeout_ms=2000)


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _sync_lease(c: Ctx) -> tuple[MongoTransport, Any]:
    t = MongoTransport(pymongo.MongoClient(c.url), c.db, prefix=c.fresh())
    t.publish("g", Event(kind="A"))
    return t, t.claim("w", 30.0)


async def _async_lease(c: Ctx) -> tuple[AsyncMongoTransport, Any]:
    t = AsyncMongoTransport(pymongo.AsyncMongoClient(c.url), c.db, prefix=c.fresh())
    await t.publish("g", Event(kind="A"))
    return t, await t.claim("w", 30.0)


def _sync_transport(c: Ctx, method: str, kw: dict[str, Any]) -> Any:
    t, lease = _sync_lease(c)
    try:
        args = {
            "publish": {"group_id": "g", "event": Event(kind="B")},
            "claim": {"worker_id": "w", "visibility": 30.0},
            "claim_many": {"worker_id": "w", "visibility": 30.0, "k": 2},
            "ack": {"lease": lease},
            "nack": {"lease": lease},
        }[method]
        return getattr(t, method)(**{**args, **kw})
    finally:
        t.close()


def _async_transport(c: Ctx, method: str, kw: dict[str, Any]) -> Any:
    async def go() -> Any:
        t, lease = await _async_lease(c)
        try:
            args = {
                "publish": {"group_id": "g", "event": Event(kind="B")},
                "claim": {"worker_id": "w", "visibility": 30.0},
                "claim_many": {"worker_id": "w", "visibility": 30.0, "k": 2},
                "ack": {"lease": lease},
                "nack": {"lease": lease},
            }[method]
            return await getattr(t, method)(**{**args, **kw})
        finally:
            await t.close()

    return _run(go())


def _closing(make: Callable[[], Any]) -> Any:
    obj = make()
    close = getattr(obj, "close", None)
    if close is not None:
        result = close()
        if inspect.isawaitable(result):
            _run(result)
    return obj


async def _with_store(c: Ctx, use: Callable[[AsyncMongoStore], Any]) -> Any:
    s = AsyncMongoStore(pymongo.AsyncMongoClient(c.url), c.db)
    try:
        await s.init()
        return await use(s)
    finally:
        await s.close()


def _on_server(c: Ctx, use: Callable[[Any], Any]) -> Any:
    """`use(database)` awaited on a client of the test's server, closed after."""

    async def go() -> Any:
        client: Any = pymongo.AsyncMongoClient(c.url)
        try:
            return await use(client[c.db])
        finally:
            await client.close()

    return _run(go())


def _migrator(c: Ctx, method: str, kw: dict[str, Any]) -> Any:
    from harel_beanie.migrate import Migrator

    if method == "__init__":
        return _on_server(c, lambda db: _value(Migrator(db, **kw)))
    args = {"run_step": {"version": 1, "direction": "up"}}.get(method, {})
    return _on_server(c, lambda db: getattr(Migrator(db), method)(**{**args, **kw}))


async def _value(value: Any) -> Any:
    return value


def _prune(c: Ctx, kw: dict[str, Any]) -> Any:
    from harel_beanie.retention import prune

    return _on_server(c, lambda db: prune(db["harel_executions"], **{"before": 0.0, **kw}))


def _metrics(method: str, c: Ctx, kw: dict[str, Any]) -> Any:
    from harel_beanie.telemetry import StoreMetrics, new_registry

    m = StoreMetrics(new_registry())
    if method == "observe_commit":
        return m.observe_commit(**{"definition": "Order", "seconds": 0.1, **kw})
    return _run(_with_store(c, lambda s: m.refresh(**kw)))


def _sweep(kw: dict[str, Any]) -> Any:
    from harel_beanie.deploy import sweep

    return _run(sweep(object(), object(), object(), {}, **kw))


def _history(c: Ctx, method: str, kw: dict[str, Any]) -> Any:
    path = c.tmp / f"{c.fresh()}.jsonl"
    if method == "__init__":
        return _closing(lambda: HistoryWriter(path, **{"process": "p", **kw}))
    w = HistoryWriter(path, "p")
    try:
        args = {"invoke": {"f": "load"}, "complete": {"i": 1, "type": "ok"}, "info": {"f": "final"}}[method]
        return getattr(w, method)(**{**args, **kw})
    finally:
        w.close()


def _calls() -> dict[str, Callable[[Ctx, dict[str, Any]], Any]]:
    from harel_beanie import bind, check, document_models, mask_url, retention
    from harel_beanie.dashboard import DashboardActions, dashboard_router, token_auth
    from harel_beanie.deploy import ScopedStore, Worker
    from harel_beanie.history import stories, story
    from harel_beanie.migrate import run_beanie_step
    from harel_beanie.queries import ExecutionFilter
    from harel_beanie.telemetry import otel_tracer
    from harel_beanie.testing import memory_async_store, memory_store
    from harel_beanie.transport import bind_queues

    def async_store(c: Ctx, kw: dict[str, Any]) -> Any:
        async def go() -> Any:
            return AsyncMongoStore(AsyncMongoMockClient(), **kw)

        return _run(go())

    def async_store_url(c: Ctx, kw: dict[str, Any]) -> Any:
        async def go() -> Any:
            s = await AsyncMongoStore.from_url(**{"url": c.url, "retry": QUICK, **kw})
            await s.close()

        return _run(go())

    def async_transport(c: Ctx, kw: dict[str, Any]) -> Any:
        async def go() -> Any:
            t = AsyncMongoTransport(AsyncMongoMockClient(), **kw)
            await t.close()

        return _run(go())

    def async_transport_url(c: Ctx, kw: dict[str, Any]) -> Any:
        async def go() -> Any:
            t = await AsyncMongoTransport.from_url(**{"url": c.url, "retry": QUICK, **kw})
            await t.close()

        return _run(go())

    return {
        "MongoStore.__init__": lambda c, kw: _closing(lambda: MongoStore(mongomock.MongoClient(), **kw)),
        "MongoStore.from_url": lambda c, kw: _closing(
            lambda: MongoStore.from_url(**{"url": c.url, "retry": QUICK, **kw})
        ),
        "AsyncMongoStore.__init__": async_store,
        "AsyncMongoStore.from_url": async_store_url,
        "MongoTransport.__init__": lambda c, kw: _closing(lambda: MongoTransport(mongomock.MongoClient(), **kw)),
        "MongoTransport.from_url": lambda c, kw: _closing(
            lambda: MongoTransport.from_url(**{"url": c.url, "retry": QUICK, **kw})
        ),
        "AsyncMongoTransport.__init__": async_transport,
        "AsyncMongoTransport.from_url": async_transport_url,
        **{
            f"MongoTransport.{m}": (lambda m: lambda c, kw: _sync_transport(c, m, kw))(m)
            for m in ("publish", "claim", "claim_many", "ack", "nack")
        },
        **{
            f"AsyncMongoTransport.{m}": (lambda m: lambda c, kw: _async_transport(c, m, kw))(m)
            for m in ("publish", "claim", "claim_many", "ack", "nack")
        },
        **{
            f"HistoryWriter.{m}": (lambda m: lambda c, kw: _history(c, m, kw))(m)
            for m in ("__init__", "invoke", "complete", "info")
        },
        "RetryPolicy.__init__": lambda c, kw: RetryPolicy(**kw),
        "RetryPolicy.overridden": lambda c, kw: RetryPolicy().overridden(**kw),
        "bind": lambda c, kw: bind(**kw),
        "document_models": lambda c, kw: document_models(**kw),
        "bind_queues": lambda c, kw: bind_queues(**kw),
        "check": lambda c, kw: check([], **kw),
        "story": lambda c, kw: story([], **kw),
        "stories": lambda c, kw: stories([], check([]), **kw),
        "mask_url": lambda c, kw: mask_url(**kw),
        "dashboard_router": lambda c, kw: dashboard_router(object(), auth=no_auth, **kw),
        "DashboardActions.__init__": lambda c, kw: DashboardActions(runner=object(), **kw),
        "token_auth": lambda c, kw: token_auth(**kw),
        "otel_tracer": lambda c, kw: otel_tracer(**kw),
        "StoreMetrics.refresh": lambda c, kw: _metrics("refresh", c, kw),
        "StoreMetrics.observe_commit": lambda c, kw: _metrics("observe_commit", c, kw),
        **{
            f"Migrator.{m}": (lambda m: lambda c, kw: _migrator(c, m, kw))(m)
            for m in ("__init__", "up", "down", "run_step")
        },
        "run_beanie_step": lambda c, kw: _run(run_beanie_step(**{"version": 1, "direction": "up", **kw})),
        "ExecutionFilter.query": lambda c, kw: ExecutionFilter().query(**kw),
        "ScopedStore.__init__": lambda c, kw: ScopedStore(object(), **{"execution_id": "x", **kw}),
        # built, not run: the arguments are checked before anything is opened
        "Worker.__init__": lambda c, kw: Worker(**{"url": c.url, "definitions": {"Order": object()}, **kw}),
        "sweep": lambda c, kw: _sweep(kw),
        "parse_age": lambda c, kw: retention.parse_age(**kw),
        "parse_before": lambda c, kw: retention.parse_before(**{"text": "1d", **kw}),
        "CollectionArchive.__init__": lambda c, kw: retention.CollectionArchive(object(), **kw),
        # `now` is checked before the archive or the executions are touched
        "CollectionArchive.recover": lambda c, kw: _run(
            retention.CollectionArchive(AsyncMongoMockClient()["d"], "archive").recover(
                **{"executions": object(), **kw}
            )
        ),
        "JsonlArchive.recover": lambda c, kw: _run(
            retention.JsonlArchive(Path(tempfile.mkdtemp()) / "archive.jsonl").recover(**{"executions": object(), **kw})
        ),
        "CollectionArchive.read": lambda c, kw: _run(
            retention.CollectionArchive(AsyncMongoMockClient()["d"], "archive").read(**kw)
        ),
        "candidates_filter": lambda c, kw: retention.candidates_filter(
            **{"status": "DONE", "before": 0.0, "after": None, **kw}
        ),
        "prune": _prune,
        "memory_store": lambda c, kw: _closing(lambda: memory_store(**kw)),
        "memory_async_store": lambda c, kw: _run(_async_memory(memory_async_store, kw)),
    }


async def _async_memory(make: Callable[..., Any], kw: dict[str, Any]) -> Any:
    s = make(**kw)
    await s.close()


CALLS = _calls()


def test_every_door_can_be_called() -> None:
    """Every door found has a way to be called here, and every parameter a kind or a reason."""
    missing = sorted({d.call for d in VALUE_DOORS} - CALLS.keys())
    assert not missing, f"say in tests/doors/test_hostile_options.py how to call these doors: {missing}"
    unknown = sorted({(d.call, d.param) for d in doors() if d.kind is None and d.param not in NOT_VALUES})
    assert not unknown, f"give these parameters a kind or a reason in tests/support/doors.py: {unknown}"


@pytest.fixture
def ctx(mongo_url: str, db_name: str, tmp_path: Path) -> Iterator[Ctx]:
    yield Ctx(mongo_url, db_name, tmp_path)


def _refused_naming(call: str, param: str, v: Any, run: Callable[[], Any]) -> str:
    """'' if the call refused `v` with a TypeError/ValueError naming `param`, else what happened."""
    try:
        run()
    except (TypeError, ValueError) as exc:
        if param in str(exc):
            return ""
        return f"{call}({param}={v!r}) raised {type(exc).__name__} not naming {param}: {str(exc)[:200]}"
    except BaseException as exc:  # noqa: BLE001 - the rule decides what may be raised
        return f"{call}({param}={v!r}) raised {type(exc).__name__}: {str(exc)[:200]}"
    return f"{call}({param}={v!r}) was accepted"


def _wrong(d: Door) -> list[Any]:
    values = list(WRONG[d.kind or "object"])
    if not d.optional and d.default is not None:
        values.append(None)
    key = f"{d.call}.{d.param}"
    if d.kind == "number" and key not in INFINITE_OK:
        values += [math.inf, -math.inf]
    if key in BOUNDED:
        values += [BOUNDED[key] * 1.01, 1e308]
    return values


@pytest.mark.parametrize("door", VALUE_DOORS, ids=[f"{d.call}-{d.param}" for d in VALUE_DOORS])
def test_every_option_refuses_a_wrong_value_naming_it(ctx: Ctx, door: Door) -> None:
    run = CALLS[door.call]
    failures = [_refused_naming(door.call, door.param, v, lambda v=v: run(ctx, {door.param: v})) for v in _wrong(door)]
    failures = [f for f in failures if f]
    assert not failures, "\n".join(failures)


# --- the command line ---------------------------------------------------------------------

FLAGS = cli_flags()
#: flags that take text as it is (a name, a path, a URL, a date the command parses itself): the reason
TEXT_FLAGS = {
    "--url": "a URL, refused by the driver as it parses it (tests/commands/test_cli.py)",
    "--db": "a database name, checked by the store's settings (tests/commands/test_cli.py)",
    "--prefix": "a prefix, checked by harel's Names (tests/commands/test_cli.py)",
    "--data": "a folder",
    "--models": "a folder",
    "--definitions": "a folder",
    "--worker-id": "a name",
    "--history": "a file",
    "--theme": "a Textual theme name",
    "--host": "an address, refused by the server that binds it",
    "--token": "a secret, any text",
    "--allow": "action names, checked by dashboard.serve (tests/commands/test_cli.py)",
    "--finished-before": "an age or date, parsed by retention.parse_before (tests/retention/test_retention.py)",
    "--archive": "a file",
    "--archive-collection": "a collection name",
    "--ttl": "'off' alone, any other value refused naming worker --retain (tests/retention/test_retention.py)",
    "--retain": "an age, parsed by core.ages.parse_age (tests/retention/test_worker_retention.py)",
    "--seen-field": "a context field name",
    "--story": "an event id, any text",
    "--transport": "argparse's choices",
}
#: what a numeric flag must refuse, by what it takes
NUMBERS = ["nan", "inf", "-inf", "1e309", "-1", "0", "lots", "1,5", "0x10"]
WHOLE = [*NUMBERS, "2.5", "1e3", str(2**40), "true"]
#: the bounded flags: a value above the bound is refused
FLAG_BOUNDS = {"--visibility": MAX_VISIBILITY, "--idle-wait": MAX_IDLE_WAIT}


def _flag_values(flag: str, action: Any) -> list[str]:
    if action.nargs == 0:
        return []  # a switch takes no value: argparse refuses one (`--json=x`)
    if action.type is int:
        return ["2.5", "lots", "1e3", "true"]
    if action.type is None:
        return []
    whole = action.metavar == "N" or action.dest in ("port", "workers", "concurrency", "show")
    values = WHOLE if whole else NUMBERS
    if flag in FLAG_BOUNDS:
        values = [*values, repr(FLAG_BOUNDS[flag] * 1.01), "1e308"]
    return values


def test_every_flag_is_known() -> None:
    """Every flag takes a number (and is tried below), is a switch, or takes text for a reason."""
    unknown = sorted({f for _, f, a in FLAGS if a.nargs != 0 and a.type is None and not a.choices} - TEXT_FLAGS.keys())
    assert not unknown, f"say what these flags take in tests/doors/test_hostile_options.py: {unknown}"


NUMERIC = [(c, f, a) for c, f, a in FLAGS if _flag_values(f, a)]


@pytest.mark.parametrize("command,flag,action", NUMERIC, ids=[f"{c}{f}" for c, f, _ in NUMERIC])
def test_every_numeric_flag_refuses_a_bad_value_naming_it(
    command: str, flag: str, action: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 and one line naming the flag, before anything connects (no server is given)."""
    failures = []
    for v in _flag_values(flag, action):
        # a server nothing answers on, tried once: a value accepted by mistake ends in a
        # connection error (not naming the flag) instead of a command that runs
        nowhere = (
            []
            if command in ("check-history", "server")  # no server to reach: one reads files, one is the server
            else ["--url=mongodb://127.0.0.1:1", "--connect-attempts=1", "--connect-timeout=0.2"]
        )
        argv = [
            command,
            *(["up"] if command.startswith("migrate") else []),
            *(["h.jsonl"] if command == "check-history" else []),
            *nowhere,
            f"{flag}={v}",
        ]
        code = cli_main(argv)
        err = capsys.readouterr().err
        if code != 2 or flag not in err or len(err.strip().splitlines()) != 1:
            failures.append(f"{' '.join(argv)}: exit {code}, {err.strip()[:200]!r}")
    assert not failures, "\n".join(failures)


# --- leases, parks and waits, each by itself ---------------------------------------------------


@pytest.mark.parametrize("value", [MAX_VISIBILITY * 1.01, 1e308])
def test_a_lease_longer_than_a_day_is_refused(mongo_url: str, db_name: str, value: float) -> None:
    """`claim(visibility=1e308)` used to lease the group until the end of time: no worker would
    ever see its messages again. Nothing is leased when it is refused."""
    t = MongoTransport(pymongo.MongoClient(mongo_url), db_name)
    try:
        t.publish("g", Event(kind="A"))
        with pytest.raises(ValueError, match="visibility"):
            t.claim("w", value)
        assert t.claim("w", 30.0) is not None
    finally:
        t.close()


def test_a_park_longer_than_a_week_is_refused(mongo_url: str, db_name: str) -> None:
    t = MongoTransport(pymongo.MongoClient(mongo_url), db_name)
    try:
        t.publish("g", Event(kind="A"))
        lease = t.claim("w", 30.0)
        with pytest.raises(ValueError, match="delay"):
            t.nack(lease, 1e308)
        t.nack(lease, MAX_PARK)  # the bound itself is a park
    finally:
        t.close()


def test_an_idle_wait_longer_than_an_hour_is_refused() -> None:
    with pytest.raises(ValueError, match="idle_wait"):
        AsyncMongoTransport(mongomock.MongoClient(), "d", idle_wait=MAX_IDLE_WAIT * 2)
