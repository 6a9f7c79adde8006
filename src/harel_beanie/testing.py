"""pytest fixtures for an app's own tests: a ready store per test, in memory or on a server.

Opt in from the app's `conftest.py`::

    pytest_plugins = ["harel_beanie.testing"]

Fixtures:

- `harel_store`: a `MongoStore`, set up, on a database of its own for this test;
- `harel_async_store`: an `AsyncMongoStore` the same way, a pytest-asyncio fixture (the extra
  installs pytest-asyncio; an async test using it is marked `@pytest.mark.asyncio`, or the
  suite runs with `asyncio_mode = auto`);
- `harel_mongo_url`: the server's URL, for tests that build their own clients (server only).

Where they live is chosen per run with `--harel-store` (or `HAREL_BEANIE_TEST_STORE`):

- `memory` (the default): a mongomock client (sync) or mongomock-motor client (async),
  fresh for every test, no server at all: fast, and every store operation works, but see
  docs/testing.md for what an in-memory fake cannot prove;
- `server`: `MONGODB_URL` if set, else the embedded test server (`harel-beanie[server]`,
  started once per session); every test gets a fresh database, dropped afterwards. The async
  store's Beanie document classes are initialised on that database, so typed queries
  (`harel_beanie.queries`, `ExecutionDocument.find(...)`) see what the store wrote.

The same helpers serve code outside pytest: `memory_store()`, `memory_async_store()`.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, AsyncIterator, Iterator

try:
    import pytest
    import pytest_asyncio
except ImportError as exc:  # an app's test code without the extra: say which one
    raise ImportError(
        "harel_beanie.testing is a pytest plugin: install its extra, pip install 'harel-beanie[testing]' "
        "(pytest, pytest-asyncio, mongomock, mongomock-motor)",
        name=exc.name,
    ) from exc

from harel_beanie.store.async_store import AsyncMongoStore
from harel_beanie.store.sync_store import MongoStore

ENV = "HAREL_BEANIE_TEST_STORE"
CHOICES = ("memory", "server")


def memory_store(db_name: str = "harel", **options: Any) -> MongoStore:
    """A store on a new mongomock client (needs `mongomock`)."""
    try:
        import mongomock
    except ImportError as exc:
        raise _missing(exc) from exc

    return MongoStore(mongomock.MongoClient(), db_name, **options)


def memory_async_store(db_name: str = "harel", **options: Any) -> AsyncMongoStore:
    """An async store on a new mongomock-motor client (needs `mongomock-motor`)."""
    try:
        from mongomock_motor import AsyncMongoMockClient
    except ImportError as exc:
        raise _missing(exc) from exc
    return AsyncMongoStore(AsyncMongoMockClient(), db_name, **options)


def _missing(exc: ImportError) -> ImportError:
    """What a memory store says when the `testing` extra is not installed: which to install."""
    return ImportError(
        f"{exc.name} is missing: install the testing extra, pip install 'harel-beanie[testing]'", name=exc.name
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--harel-store",
        choices=CHOICES,
        default=None,
        help=f"where harel_store / harel_async_store live: memory (mongomock, the default) or "
        f"server (MONGODB_URL, else the embedded server); also {ENV}",
    )


def _kind(config: pytest.Config) -> str:
    kind = config.getoption("--harel-store") or os.environ.get(ENV) or "memory"
    if kind not in CHOICES:
        raise pytest.UsageError(f"{ENV} must be one of {', '.join(CHOICES)}, got {kind!r}")
    return str(kind)


#: set to 1 to start the embedded server as a one-member replica set (change streams on)
#: rather than as a standalone server (the design's case, and faster)
REPLICA_SET_ENV = "HAREL_BEANIE_TEST_REPLICA_SET"


@pytest.fixture(scope="session")
def harel_mongo_url() -> Iterator[str]:
    """A real server's URL: `MONGODB_URL`, else the embedded server, started for the session
    (standalone, or a one-member replica set with `HAREL_BEANIE_TEST_REPLICA_SET=1`)."""
    url = os.environ.get("MONGODB_URL")
    if url:
        yield url
        return
    from harel_beanie.deploy.embedded import EmbeddedServer

    with EmbeddedServer(standalone=os.environ.get(REPLICA_SET_ENV) != "1") as server:
        yield server.url


def _fresh_name() -> str:
    return "hb_test_" + uuid.uuid4().hex[:12]


@pytest.fixture
def harel_store(request: pytest.FixtureRequest) -> Iterator[MongoStore]:
    """A set-up `MongoStore` of this test's own (in memory, or on a fresh database)."""
    if _kind(request.config) == "memory":
        store = memory_store()
        store.init()
        yield store
        store.close()
        return
    import pymongo

    url = request.getfixturevalue("harel_mongo_url")
    name = _fresh_name()
    store = MongoStore(pymongo.MongoClient(url), name)
    store.init()
    try:
        yield store
    finally:
        store._client.drop_database(name)
        store.close()


# a pytest-asyncio fixture, not a bare `async def` under `pytest.fixture`: that one runs only in
# a suite set to `asyncio_mode = auto`, and pytest refuses it in pytest-asyncio's default mode
@pytest_asyncio.fixture
async def harel_async_store(request: pytest.FixtureRequest) -> AsyncIterator[AsyncMongoStore]:
    """A set-up `AsyncMongoStore` of this test's own. On a server its Beanie document
    classes are initialised on its database (Beanie cannot initialise on mongomock-motor)."""
    if _kind(request.config) == "memory":
        astore = memory_async_store()
        await astore.init()
        yield astore
        await astore.close()
        return
    import pymongo

    url = request.getfixturevalue("harel_mongo_url")
    name = _fresh_name()
    # the client is made here, on the loop that runs this test
    astore = AsyncMongoStore(pymongo.AsyncMongoClient(url), name)
    await astore.init()
    try:
        yield astore
    finally:
        await astore._client.drop_database(name)
        await astore.close()
