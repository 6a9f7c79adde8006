"""Security: no operator injection through any value a caller passes, a literal id-prefix
search, SCRAM authentication and TLS through the URL.

tests/store/test_store.py checks the first injection cases (load, is_processed's event id,
ids_with_prefix, purge, ack_outbox, ack_spawn, load_for_event's event id, delete_timer's
id); these are every other value a caller hands the store. A refused call must raise
TypeError or ValueError and leave every stored document as it was.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import quote, quote_plus

import pymongo
import pytest
from harel.engine.execution import Execution
from harel.engine.store.base import TimerOp
from harel.spec.states import Event
from pymongo.errors import OperationFailure

from harel_beanie import AsyncMongoStore, MongoStore, RetryPolicy, StoreUnavailable
from harel_beanie.deploy.embedded import EmbeddedServer, server_command
from tests.support.both import settle

QUICK = RetryPolicy(attempts=2, delay=0.1, timeout_ms=1500)
ONCE = RetryPolicy(attempts=1, timeout_ms=1000)  # for servers expected to refuse


def everything(client: pymongo.MongoClient[Any], db_name: str) -> list[Any]:
    db = client[db_name]
    return [sorted(db[c].find({}), key=lambda d: str(d["_id"])) for c in sorted(db.list_collection_names())]


def seed(store: Any) -> None:
    exe = Execution(id="x", definition_id="d", context={"k": 1})
    store.commit(
        exe,
        [("x", Event(kind="A"))],
        processed_event_id="ev",
        timers=(TimerOp("schedule", "T", 5.0),),
        spawns=(("kid", "R", {}),),
        trace={"s": 0},
    )
    store.commit(Execution(id="y", definition_id="d"), [])


def cursor_of(payload: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()


OP = {"$gt": ""}
INJECTIONS: dict[str, Callable[[Any], Any]] = {
    "is_processed: execution id": lambda s: s.is_processed(OP, "ev"),
    "load_for_event: execution id": lambda s: s.load_for_event(OP, "ev"),
    "read_trace: execution id": lambda s: s.read_trace(OP),
    "append_trace: execution id": lambda s: s.append_trace(OP, {"s": 1}),
    "delete_timer: path": lambda s: s.delete_timer("x", OP, 5.0),
    "list: definition id": lambda s: s.list_executions(definition_id={"$ne": None}),
    "list: cursor as a dict": lambda s: s.list_executions(cursor=OP),
    "list: cursor holding an operator": lambda s: s.list_executions(cursor=cursor_of({"after": OP})),
    "list: cursor holding a list": lambda s: s.list_executions(cursor=cursor_of({"after": ["x"]})),
    "list: status": lambda s: s.list_executions(status=[{"$ne": None}]),
    "list: limit": lambda s: s.list_executions(limit={"$gt": 0}),
    "ids_with_prefix: list": lambda s: s.ids_with_prefix(["x"]),
    "ack_outbox: bool": lambda s: s.ack_outbox(True),
    "ack_outbox: float": lambda s: s.ack_outbox(1.0),
    "ack_spawn: operator": lambda s: s.ack_spawn({"$gt": 0}),
    "purge: version bool": lambda s: s.purge("x", True),
    "purge: version str": lambda s: s.purge("x", "1"),
    "commit: processed event id": lambda s: s.commit(s.load("x"), [], processed_event_id={"$ne": None}),
    "commit: emit target": lambda s: s.commit(s.load("x"), [({"$ne": None}, Event(kind="A"))]),
    "commit: spawn child id": lambda s: s.commit(s.load("x"), [], spawns=((OP, "R", {}),)),
    "commit: spawn root path": lambda s: s.commit(s.load("x"), [], spawns=(("c", OP, {}),)),
    "commit: timer path": lambda s: s.commit(s.load("x"), [], timers=(TimerOp("schedule", OP, 1.0),)),  # type: ignore[arg-type]
    "commit: timer fire time": lambda s: s.commit(s.load("x"), [], timers=(TimerOp("schedule", "T", OP),)),  # type: ignore[arg-type]
    "commit: timer action": lambda s: s.commit(s.load("x"), [], timers=(TimerOp("$unset", "T", 1.0),)),
    "commit: unvalidated execution id": lambda s: s.commit(
        Execution.model_construct(id=OP, definition_id="d", version=1), []
    ),
    "commit: unvalidated definition id": lambda s: s.commit(
        Execution.model_construct(id="z", definition_id=OP, version=0), []
    ),
    "commit: unvalidated version": lambda s: s.commit(
        Execution.model_construct(id="x", definition_id="d", version=OP), []
    ),
}


@pytest.mark.parametrize("call", list(INJECTIONS.values()), ids=list(INJECTIONS))
def test_operator_injection_through_every_other_value_is_refused(either, client, db_name, call):
    """Operator injection through every value a caller passes that tests/store/test_store.py does not
    already cover (ids of every read, paths, cursors and the ids inside them, statuses,
    limits, seqs, versions, event ids, emit targets, spawn ids, timer paths, fire times and
    actions, unvalidated `Execution` fields): refused with TypeError/ValueError, every
    stored document unchanged."""
    seed(either)
    before = everything(client, db_name)
    with pytest.raises((TypeError, ValueError)):
        call(either)
    assert everything(client, db_name) == before


@pytest.mark.parametrize("fire_at", [{"$exists": True}, {"$gt": 0}, {"$ne": None}], ids=["exists", "gt", "ne"])
def test_delete_timer_fire_time_injection_is_refused(either, client, db_name, fire_at):
    """An operator as `delete_timer`'s fire time is refused and deletes nothing."""
    seed(either)
    before = everything(client, db_name)
    with pytest.raises((TypeError, ValueError)):
        either.delete_timer("x", "T", fire_at)
    assert everything(client, db_name) == before


def test_due_timers_refuses_a_non_number_or_treats_it_literally(either, client, db_name):
    """An operator or a str as `now` is refused, or (were it let through) compared as a
    literal value that no fire time equals or exceeds: nothing returned, nothing written."""
    seed(either)
    before = everything(client, db_name)
    for now in ({"$ne": None}, {"$gt": 0}, "9999"):
        try:
            assert either.due_timers(now) == []
        except (TypeError, ValueError):
            pass
    assert everything(client, db_name) == before
    assert either.due_timers(10.0) == [("x", "T", 5.0)]


OPERATOR_LOOKING = [
    "$gt",
    "$where",
    '{"$ne": null}',
    "{$ne: 1}",
    "$",
    "$$ROOT",
    "x.$",
    "this.x == 1",
    "'; return true; '",
]


def test_operator_looking_strings_are_plain_strings_everywhere(either):
    """Every string that looks like query syntax is stored and matched as itself."""
    for s in OPERATOR_LOOKING:
        exe = Execution(id=s, definition_id=s, context={s: s})
        either.commit(
            exe,
            [(s, Event(id=s + "#ev", kind=s, data={s: s}))],
            processed_event_id=s,
            timers=(TimerOp("schedule", s, 1.0),),
        )
    for s in OPERATOR_LOOKING:
        assert either.load(s).context == {s: s}
        assert either.is_processed(s, s) and not either.is_processed(s, s + "x")
        assert [r.id for r in either.list_executions(definition_id=s).items] == [s]
    assert sorted((i, p) for i, p, _ in either.due_timers(2.0)) == sorted((s, s) for s in OPERATOR_LOOKING)
    assert sorted((e.event.data for e in either.pending_outbox()), key=str) == sorted(
        ({s: s} for s in OPERATOR_LOOKING), key=str
    )


# --- the id-prefix search matches literally -------------------------------------------------

PREFIX_IDS = [
    "a.b",
    "a\uff0eb",
    "a\uff0e",
    "a.",
    "ab",
    "a",
    "a*",
    "a+b",
    "a\\b",
    "a\\.b",
    "^a",
    "a$",
    "a|b",
    "(?i)A",
    "A",
    "[ab]",
    "a\x00b",
    "a\x00",
    "\U0010ffff",
    "\U0010ffffz",
    "\U0010ffff\U0010ffff",
    "\ud7ff",
    "\ud7ffx",
    "\ue000",
    "\uffff",
    "\uffffa",
    "é",
    "e\u0301",
    "\u00e9t\u00e9",
    "日本",
    "日本語",
    "",
]
PREFIXES = [
    "a.",
    "a\uff0e",
    "a",
    "a\\",
    "a\\.",
    "^",
    "^a",
    "a$",
    "a|",
    "(?i)",
    "[",
    "[ab]",
    ".",
    ".*",
    "*",
    "\\",
    "a\x00",
    "\x00",
    "\U0010ffff",
    "\U0010ffff\U0010ffff",
    "\ud7ff",
    "\ue000",
    "\uffff",
    "e",
    "é",
    "日本",
    "A",
    "b",
]


def test_the_id_prefix_search_is_literal_for_every_awkward_prefix(either):
    """The id-prefix search is literal for dots, the fullwidth dot, regex metacharacters, NUL
    and code point boundaries."""
    for i in PREFIX_IDS:
        either.save(Execution(id=i, definition_id="d"))
    for p in PREFIXES:
        assert sorted(either.ids_with_prefix(p)) == sorted(i for i in PREFIX_IDS if i.startswith(p)), repr(p)


# --- SCRAM authentication through the URL -------------------------------------------------

APP_PASSWORD = "p@ss:w/rd%?#[]"  # every character a URL gives a meaning to


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    try:
        server_command()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    storage = tmp_path_factory.mktemp("auth")
    server = EmbeddedServer(storage).start()  # users first, with authentication off
    c: pymongo.MongoClient[Any] = pymongo.MongoClient(server.url)
    c.admin.command("createUser", "root", pwd="rootpw", roles=["root"])
    c["app"].command("createUser", "app", pwd=APP_PASSWORD, roles=[{"role": "readWrite", "db": "app"}])
    c.close()
    server.stop()
    server = EmbeddedServer(storage, port=server.port, auth=True).start()
    yield server
    server.stop()


def app_url(server: EmbeddedServer, password: str = APP_PASSWORD, **params: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"authSource": "app", **params}.items())
    return f"mongodb://app:{quote_plus(password)}@127.0.0.1:{server.port}/?{query}"


def exercise(store: MongoStore) -> None:
    """Every kind of command the store sends, as the least-privileged user (readWrite)."""
    exe = Execution(id="a", definition_id="d")
    store.commit(exe, [("a", Event(kind="A"))], timers=(TimerOp("schedule", "T", 1.0),), spawns=(("k", "R", {}),))
    store.commit(exe, [], processed_event_id="ev", trace={"s": 1})
    assert store.load("a").version == 2 and store.is_processed("a", "ev")
    settle(store, 5.0)
    assert [r.id for r in store.list_executions().items] == ["a"]
    assert store.purge("a", 2) is True


@pytest.mark.parametrize("mechanism", [None, "SCRAM-SHA-256"])
def test_scram_credentials_in_the_url_work_for_the_sync_store(auth_server, mechanism):
    """SCRAM-SHA-256 through the URL (a password holding `@:/%?#[]`, `authSource`, optional
    `authMechanism`) works for the sync store as a user with only `readWrite` on its
    database."""
    url = app_url(auth_server, **({"authMechanism": mechanism} if mechanism else {}))
    store = MongoStore.from_url(url, "app", retry=QUICK)
    exercise(store)
    store.close()


async def test_scram_credentials_in_the_url_work_for_the_async_store(auth_server):
    """The same SCRAM credentials work for the async store."""
    store = await AsyncMongoStore.from_url(app_url(auth_server), "app", retry=QUICK)
    exe = Execution(id="b", definition_id="d")
    await store.commit(exe, [("b", Event(kind="A"))])
    assert (await store.load("b")).version == 1
    assert await store.purge("b", 1) is True
    await store.close()


def test_an_unauthenticated_client_is_refused_and_writes_nothing(auth_server):
    """An unauthenticated sync client is refused with code 13 (Unauthorized) and writes
    nothing."""
    root: pymongo.MongoClient[Any] = pymongo.MongoClient(f"mongodb://root:rootpw@127.0.0.1:{auth_server.port}/")
    before = everything(root, "app")
    for options in ({}, {"create_schema": False}):
        store = MongoStore(pymongo.MongoClient(auth_server.url, serverSelectionTimeoutMS=2000), "app", **options)
        for op in (lambda s: s.load("a"), lambda s: s.commit(Execution(id="intruder", definition_id="d"), [])):
            with pytest.raises(OperationFailure) as err:
                op(store)
            assert err.value.code == 13  # Unauthorized
        store.close()
    assert everything(root, "app") == before
    root.close()


async def test_an_unauthenticated_async_client_is_refused(auth_server):
    """An unauthenticated async client is refused with code 13."""
    store = AsyncMongoStore(pymongo.AsyncMongoClient(auth_server.url, serverSelectionTimeoutMS=2000), "app")
    with pytest.raises(OperationFailure) as err:
        await store.commit(Execution(id="intruder", definition_id="d"), [])
    assert err.value.code == 13
    await store.close()


def test_a_user_of_another_database_is_refused(auth_server):
    """A user of another database is refused with code 13."""
    store = MongoStore(pymongo.MongoClient(app_url(auth_server)), "elsewhere")
    with pytest.raises(OperationFailure) as err:
        store.load("a")
    assert err.value.code == 13
    store.close()


def test_a_wrong_password_is_reported_with_the_password_masked(auth_server):
    """A wrong password is reported as StoreUnavailable with the password masked in the
    message."""
    with pytest.raises(StoreUnavailable) as err:
        MongoStore.from_url(app_url(auth_server, password="wrong-Secret"), "app", retry=QUICK)
    text = str(err.value)
    assert "wrong-Secret" not in text and "app:***@" in text and "uthentication failed" in text


# --- TLS through the URL ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedServer, Path]]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    try:
        server_command()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    d = tmp_path_factory.mktemp("tls")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=harel-beanie test CA",
    )
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"
    )
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "san.cnf",
    )
    server = EmbeddedServer(
        None, extra_args=["--tls-cert-file", str(d / "server.pem"), "--tls-key-file", str(d / "server.key")]
    ).start()
    yield server, d / "ca.pem"
    server.stop()


def tls_url(server: EmbeddedServer, ca: Path) -> str:
    return f"mongodb://127.0.0.1:{server.port}/?tls=true&tlsCAFile={quote(str(ca))}"


def test_tls_options_in_the_url_work_for_the_sync_store(tls_server):
    """TLS through the URL (`tls=true&tlsCAFile=...`) works for the sync store."""
    server, ca = tls_server
    store = MongoStore.from_url(tls_url(server, ca), "tls", retry=QUICK)
    exercise(store)
    store.close()


async def test_tls_options_in_the_url_work_for_the_async_store(tls_server):
    """TLS through the URL works for the async store."""
    server, ca = tls_server
    store = await AsyncMongoStore.from_url(tls_url(server, ca), "tls", retry=QUICK)
    await store.commit(Execution(id="t", definition_id="d"), [])
    assert (await store.load("t")).version == 1
    await store.close()


def test_a_plaintext_client_cannot_talk_to_a_tls_server(tls_server):
    """A plaintext client cannot talk to the TLS server: StoreUnavailable."""
    server, _ = tls_server
    with pytest.raises(StoreUnavailable):
        MongoStore.from_url(server.url, "tls", retry=ONCE)


def test_a_tls_client_refuses_a_server_it_cannot_verify(tls_server):
    """A TLS client without the CA refuses the server: certificate verify failed."""
    server, _ = tls_server
    with pytest.raises(StoreUnavailable, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        MongoStore.from_url(f"mongodb://127.0.0.1:{server.port}/?tls=true", "tls", retry=ONCE)
