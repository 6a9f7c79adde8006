"""Run one test body against both stores: the async store behind a blocking facade.

The facade runs an `AsyncMongoStore` on an event loop in a background thread, so a test
written against the sync protocol exercises the async store's own I/O shell as well.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Iterator

import pymongo

from harel_beanie import AsyncMongoStore, MongoStore


class BlockingAsyncStore:
    def __init__(self, factory: Callable[[], AsyncMongoStore]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.inner: AsyncMongoStore = self._call(self._make(factory))

    @staticmethod
    async def _make(factory: Callable[[], AsyncMongoStore]) -> AsyncMongoStore:
        return factory()  # the client must be created on the loop that uses it

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=120)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr
        return lambda *a, **kw: self._call(attr(*a, **kw))

    def shutdown(self) -> None:
        self._call(self.inner.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def make_store(kind: str, url: str, db_name: str, **options: Any) -> Any:
    if kind == "sync":
        return MongoStore(pymongo.MongoClient(url), db_name, **options)
    return BlockingAsyncStore(lambda: AsyncMongoStore(pymongo.AsyncMongoClient(url), db_name, **options))


def close_store(store: Any) -> None:
    if isinstance(store, BlockingAsyncStore):
        store.shutdown()
    else:
        store.close()


def stores(kind: str, url: str, db_name: str, **options: Any) -> Iterator[Any]:
    s = make_store(kind, url, db_name, **options)
    try:
        yield s
    finally:
        close_store(s)


def settle(store: Any, now: float) -> None:
    """Hand on everything pending, as the relays and the timer sweeper would: ack every
    outbox entry and spawn, and delete every timer due at `now`."""
    for e in store.pending_outbox():
        store.ack_outbox(e.seq)
    for s in store.pending_spawns():
        store.ack_spawn(s.seq)
    for exe_id, path, at in store.due_timers(now):
        store.delete_timer(exe_id, path, at)
