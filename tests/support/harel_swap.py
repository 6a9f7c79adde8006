"""A pytest plugin, loaded into a run of harel's own test suite (`-p tests.support.harel_swap`), that
puts a Mongo store where the suite uses its in-memory stores and its Mongo stores.

harel's generic engine tests build `DictStore()` / `AsyncDictStore()`; its Mongo-store tests
build `MongoStore(mongomock.MongoClient())` or `MongoStore.from_url(url)`. This plugin makes
each of those build the store under test instead, so the same test files measure either
store on either backend. Chosen by two environment variables:

- `HB_SWAP_STORE`: `ours` (harel_beanie's stores) or `harel` (harel's own Mongo stores);
- `HB_SWAP_SERVER`: `mongomock` (mongomock / mongomock-motor clients) or a `mongodb://` URL;
- `HB_SWAP_TRANSPORT`: `ours` puts this package's `MongoTransport` / `AsyncMongoTransport`
  where harel's suite builds its own (`harel`, the default, leaves them).

On a real server every swapped-in in-memory store gets a fresh database, dropped when its
test ends, and `mongomock.MongoClient()` (what harel's Mongo unit tests inject) becomes a
client of that server that gives each test databases of its own. The other way round, on
mongomock with this package's transport, `from_url` of the swapped-in async transport and
store (what harel's server tests build) makes an in-memory client instead of dialling.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Iterator, Optional

import pytest

STORE = os.environ.get("HB_SWAP_STORE", "ours")
SERVER = os.environ.get("HB_SWAP_SERVER", "mongomock")
REAL = SERVER != "mongomock"
TRANSPORT = os.environ.get("HB_SWAP_TRANSPORT", "harel")

_databases: list[str] = []  # fresh databases made during the current test
_shared: dict[str, Any] = {}


class _Unclosable:
    """A shared sync client handed to many stores: a store's `close()` must not close it.
    With `rename`, every database it is asked for is one of this test's own (`hbx_...`), so
    harel's tests, which use the `harel` database, never touch a real one of that name."""

    def __init__(self, client: Any, rename: bool = False) -> None:
        self._inner = client
        self._names: Optional[dict[str, str]] = {} if rename else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __getitem__(self, name: str) -> Any:
        return self.get_database(name)

    def get_database(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self._names is not None:
            if name not in self._names:
                self._names[name] = _fresh_db()
            name = self._names[name]
        return self._inner.get_database(name, *args, **kwargs)

    def close(self) -> None:
        pass


def _real_client() -> Any:
    if "client" not in _shared:
        import pymongo

        _shared["client"] = pymongo.MongoClient(SERVER)
    return _shared["client"]


def _fresh_db() -> str:
    name = "hbx_" + uuid.uuid4().hex[:12]
    _databases.append(name)
    return name


def _store_classes() -> tuple[Any, Any]:
    if STORE == "ours":
        from harel_beanie import AsyncMongoStore, MongoStore

        return MongoStore, AsyncMongoStore
    from harel.engine.aio_store.mongo import AsyncMongoStore as HarelAsync
    from harel.engine.store.mongo import MongoStore as HarelSync

    return HarelSync, HarelAsync


def _sync_store() -> Any:
    sync_cls, _ = _store_classes()
    if not REAL:
        return sync_cls(_ORIGINAL["mongomock.MongoClient"]())
    return sync_cls(_Unclosable(_real_client()), _fresh_db())


def _async_store() -> Any:
    _, async_cls = _store_classes()
    if not REAL:
        from mongomock_motor import AsyncMongoMockClient

        return async_cls(AsyncMongoMockClient())
    if STORE == "ours":
        import pymongo

        return async_cls(pymongo.AsyncMongoClient(SERVER), _fresh_db())
    import motor.motor_asyncio

    return async_cls(motor.motor_asyncio.AsyncIOMotorClient(SERVER), _fresh_db())


class SwappedDictStore:
    """Stands where harel's tests build `DictStore()`: builds the store under test."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return _sync_store()


class SwappedAsyncDictStore:
    """Stands where harel's tests build `AsyncDictStore()`."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return _async_store()


def _mock_client(*args: Any, **kwargs: Any) -> Any:
    """`mongomock.MongoClient()` on a real server: the shared client of that server."""
    return _Unclosable(_real_client(), rename=True)


def _swapped_async_transport() -> Any:
    """This package's `AsyncMongoTransport` as harel's server tests build theirs: `from_url`
    gives each transport a fresh database (on mongomock, a client of its own), as the reset
    of harel's fixture gives it empty collections."""
    from harel_beanie.transport import AsyncMongoTransport

    class SwappedAsyncMongoTransport(AsyncMongoTransport):
        def __init__(self, *args: Any, **options: Any) -> None:
            options.setdefault("partitions", owning_every_partition())
            super().__init__(*args, **options)

        @classmethod
        async def from_url(cls, url: str, db_name: str = "harel", *args: Any, **options: Any) -> Any:
            kept = {k: v for k, v in options.items() if k in ("prefix", "create_schema")}
            if not REAL:
                from mongomock_motor import AsyncMongoMockClient

                return cls(AsyncMongoMockClient(), db_name, **kept)
            import pymongo

            return cls(pymongo.AsyncMongoClient(SERVER), _fresh_db(), **kept)

        # harel's fixture drops its transport's collections by their private names before
        # each test (and makes its lock index): here they name harel's collections in this
        # transport's fresh database, so that reset runs and touches nothing of ours
        def _harels(self, name: str) -> Any:
            return self._client[self.settings.db_name][f"{self.settings.prefix}_transport_{name}"]

        @property
        def _msgs(self) -> Any:
            return self._harels("messages")

        @property
        def _locks(self) -> Any:
            return self._harels("locks")

        @property
        def _counters(self) -> Any:
            return self._harels("counters")

    return SwappedAsyncMongoTransport


def _in_memory_async_store(async_cls: Any) -> Any:
    """The async store class with a `from_url` that builds it on mongomock-motor."""

    class InMemoryAsyncStore(async_cls):  # type: ignore[misc,valid-type]
        @classmethod
        async def from_url(cls, *args: Any, **kwargs: Any) -> Any:
            return _async_store()

    return InMemoryAsyncStore


def owning_every_partition() -> Any:
    """A partition scope holding every partition by lease, as a lone worker's would: harel's
    transport tests then run this transport's claims over its owned partitions (the path a
    `harel-beanie worker` takes), not the unowned claim over all documents."""
    from harel_beanie.core.partitions import DEFAULT_PARTITIONS, Held, PartitionScope

    return PartitionScope(held={p: Held(1, 4e9) for p in range(DEFAULT_PARTITIONS)})


def _owning(cls: Any) -> Any:
    class Owning(cls):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **options: Any) -> None:
            options.setdefault("partitions", owning_every_partition())
            super().__init__(*args, **options)

    Owning.__name__ = cls.__name__
    return Owning


def _swap_transports(async_store_cls: Any) -> Any:
    """Put this package's transports where harel's suite imports its own; returns the async
    store class to put in harel's place."""
    import harel.engine.aio_transport as aio_transport
    import harel.engine.transport as transport
    import harel.worker as worker

    from harel_beanie.transport import MongoTransport

    owning = _owning(MongoTransport)
    transport.MongoTransport = owning  # type: ignore[misc,assignment]
    worker.MongoTransport = owning  # type: ignore[attr-defined]
    aio_transport.AsyncMongoTransport = _swapped_async_transport()  # type: ignore[misc]
    return async_store_cls if REAL else _in_memory_async_store(async_store_cls)


_ORIGINAL: dict[str, Any] = {}


def pytest_configure(config: pytest.Config) -> None:
    import harel
    import harel.engine.aio_store as aio_store
    import harel.engine.runtime as runtime
    import harel.engine.store as store
    import harel.worker as worker
    import mongomock

    _ORIGINAL["mongomock.MongoClient"] = mongomock.MongoClient
    sync_cls, async_cls = _store_classes()
    for module in (harel, store, runtime):
        setattr(module, "DictStore", SwappedDictStore)
    aio_store.AsyncDictStore = SwappedAsyncDictStore  # type: ignore[misc,assignment]
    for module in (store, worker):
        setattr(module, "MongoStore", sync_cls)
    if TRANSPORT == "ours":
        async_cls = _swap_transports(async_cls)
    aio_store.AsyncMongoStore = async_cls  # type: ignore[misc]
    if REAL:
        mongomock.MongoClient = _mock_client  # type: ignore[misc,assignment]


@pytest.fixture(autouse=True)
def _swap_databases() -> Iterator[None]:
    """On a real server: drop the fresh databases the test's stores were given, and the one
    harel's `stack` tests were pointed at (`HAREL_MONGO_DB`, a fresh name per run)."""
    yield
    if REAL:
        client = _real_client()
        while _databases:
            client.drop_database(_databases.pop())
        if os.environ.get("HAREL_MONGO_DB", "").startswith("hbx_"):
            client.drop_database(os.environ["HAREL_MONGO_DB"])
