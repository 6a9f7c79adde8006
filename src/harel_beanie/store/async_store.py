"""`AsyncMongoStore`: harel's `AsyncExecutionStore` over PyMongo's `AsyncMongoClient` (Motor
and mongomock-motor clients work too), for harel's `AsyncDurableRunner` and `AsyncWorker`.
A thin shell: it awaits the calls the flows in `harel_beanie.core.flows` ask for (each as
`harel_beanie.store.dispatch` says).
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterable, Optional, Sequence

from harel.engine.execution import Execution, ExecutionPage, Status
from harel.engine.store.base import OutboxEntry, SpawnEntry, Step, TimerOp
from harel.spec.states import Event
from pymongo.errors import PyMongoError

from harel_beanie.core import calls, flows
from harel_beanie.core.arguments import require_bool
from harel_beanie.core.calls import Flow, T
from harel_beanie.core.commit import CommitRequest
from harel_beanie.core.counting import Counts
from harel_beanie.core.documents import bind
from harel_beanie.store.connect import RetryPolicy, await_server
from harel_beanie.store.dispatch import acall, adrive, maybe_await
from harel_beanie.store.settings import StoreShell
from harel_beanie.store.sharding import routing_check_async


class AsyncMongoStore(StoreShell):
    """A durable harel `AsyncExecutionStore` on MongoDB, one document per execution.

    `client` is PyMongo's `AsyncMongoClient`; a Motor client (Motor's or mongomock-motor's)
    also serves the store's own operations, as a drop-in for harel's AsyncMongoStore. With
    `beanie=True` and a PyMongo client, set-up also initialises the Beanie document classes
    on this database, so the app can query them (see `harel_beanie.queries`)."""

    def __init__(self, client: Any, db_name: str = "harel", *, beanie: bool = True, **options: Any) -> None:
        """`options` as for `MongoStore`: prefix, create_schema, trace_max, dedupe_window,
        write_concern, read_concern."""
        super().__init__(client, db_name, **options)
        self._beanie = require_bool("beanie", beanie)
        self._setup_lock: Optional[asyncio.Lock] = None

    @classmethod
    async def from_url(
        cls,
        url: str,
        db_name: str = "harel",
        connect_retries: Optional[int] = None,
        retry_delay: Optional[float] = None,
        *,
        retry: RetryPolicy = RetryPolicy(),
        client_options: Optional[dict[str, Any]] = None,
        **options: Any,
    ) -> "AsyncMongoStore":
        """Build an `AsyncMongoClient` for `url`, wait until the server answers a ping
        (retrying per `retry`), and return a store on it. `connect_retries` and
        `retry_delay`, as harel's store takes them, override `retry`'s attempts and delay.
        `client_options` go to the client (e.g. `event_listeners`, `tls`); `options` to
        the store. Raises `StoreUnavailable` naming the URL, password masked, if it never does.

        With `beanie=True` (the default) the Beanie document classes are bound to this
        database before it returns, so a typed query (`ExecutionDocument.find(...)`,
        `harel_beanie.queries`) works from the first line after it; the rest of the set-up
        (indexes, layout check) waits for `init()` or the first store operation."""
        from pymongo import AsyncMongoClient

        retry = retry.overridden(connect_retries, retry_delay)
        settings = retry.client_settings(client_options)
        store = cls(await await_server(lambda: AsyncMongoClient(url, **settings), url, retry), db_name, **options)
        await store._bind_documents()
        return store

    async def init(self) -> None:
        """Set the store up now instead of on first use: Beanie's init of the document
        classes (PyMongo clients), indexes when create_schema, layout check, seq node."""
        if self._setup_lock is None:
            self._setup_lock = asyncio.Lock()
        async with self._setup_lock:
            if self._state.ready:
                return
            await self._bind_documents()
            if self._detect_mongos:
                db, prefix = self.settings.db_name, self.settings.prefix
                self._state.scope.sharded = await routing_check_async(self._client, db, prefix)
                self._detect_mongos = False
            await self._drive(flows.setup(self._state))

    async def _bind_documents(self) -> None:
        """Beanie's init of the document classes on this database (PyMongo clients, with
        `beanie=True`): two reads (the server's version, the collection names), no write."""
        if self._beanie and _is_pymongo_async(self._client):
            from beanie import init_beanie

            await init_beanie(
                database=self._client[self.settings.db_name],
                document_models=list(bind(self.settings.prefix)),
                skip_indexes=True,  # created by set-up, the same way as the sync store
            )

    async def _run(self, flow: Flow[T]) -> T:
        if not self._state.ready:
            await self.init()
        with self._state.operation():  # every operation counts (flows.relays: one relay read, not two)
            return await self._drive(flow)

    async def _drive(self, flow: Flow[T]) -> T:
        return await adrive(flow, self._call)

    async def _call(self, c: calls.Call) -> Any:
        return await acall(self._colls, c, self._state.scope)

    # --- AsyncExecutionStore ----------------------------------------------------------------

    async def load(self, execution_id: str) -> Optional[Execution]:
        return await self._run(flows.load(self._state, execution_id))

    async def load_for_event(self, execution_id: str, event_id: str) -> tuple[Optional[Execution], bool]:
        """The execution and whether it already processed `event_id`, in one round trip."""
        return await self._run(flows.load_for_event(self._state, execution_id, event_id))

    async def list_executions(
        self,
        *,
        status: Optional[Iterable[Status]] = None,
        definition_id: Optional[str] = None,
        roots_only: bool = False,
        limit: int = 100,
        cursor: Optional[str] = None,
    ) -> ExecutionPage:
        return await self._run(flows.list_executions(self._state, status, definition_id, roots_only, limit, cursor))

    async def save(self, exe: Execution) -> None:
        await self.commit(exe, [])

    async def commit(
        self,
        exe: Execution,
        emits: list[tuple[Optional[str], Event]],
        processed_event_id: Optional[str] = None,
        timers: tuple[TimerOp, ...] = (),
        spawns: tuple[tuple[str, str, dict[str, Any]], ...] = (),
        trace: Optional[dict[str, Any]] = None,
        step: Optional[Step] = None,
    ) -> list[int]:
        request = CommitRequest(exe, emits, processed_event_id, timers, spawns, trace, step)
        return await self._run(flows.commit(self._state, request))

    async def is_processed(self, execution_id: str, event_id: str) -> bool:
        return await self._run(flows.is_processed(self._state, execution_id, event_id))

    async def append_trace(self, execution_id: str, entry: dict[str, Any]) -> None:
        await self._run(flows.append_trace(self._state, execution_id, entry))

    async def read_trace(self, execution_id: str) -> list[dict[str, Any]]:
        return await self._run(flows.read_trace(self._state, execution_id))

    async def pending_outbox(self, *, within: Optional[str] = None) -> list[OutboxEntry]:
        """Pending entries, oldest first; `within` an execution id: only those of that
        execution and its descendants (what one execution's relay should see)."""
        return await self._run(flows.pending_outbox(self._state, within))

    async def ack_outbox(self, seq: int) -> None:
        await self._run(flows.ack_outbox(self._state, seq))

    async def pending_spawns(self, *, within: Optional[str] = None) -> list[SpawnEntry]:
        """Pending entries, oldest first; `within` an execution id: only those of that
        execution and its descendants (what one execution's relay should see)."""
        return await self._run(flows.pending_spawns(self._state, within))

    async def ack_spawn(self, seq: int) -> None:
        await self._run(flows.ack_spawn(self._state, seq))

    async def due_timers(self, now: float) -> list[tuple[str, str, float]]:
        return await self._run(flows.due_timers(self._state, now))

    async def next_timer(self, after: float) -> Optional[float]:
        """The earliest timer bound later than `after` (epoch seconds), or None: when an idle
        worker should next sweep for due timers (this transport's idle claims wait for it)."""
        return await self._run(flows.next_timer(self._state, after))

    async def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None:
        await self._run(flows.delete_timer(self._state, execution_id, path, fire_at))

    async def ids_with_prefix(self, prefix: str) -> list[str]:
        return await self._run(flows.ids_with_prefix(self._state, prefix))

    async def purge(self, execution_id: str, expected_version: int) -> bool:
        return await self._run(flows.purge(self._state, execution_id, expected_version))

    async def fold_counts(
        self,
        parts: Optional[Sequence[int]] = None,
        *,
        ids: Optional[Sequence[str]] = None,
        build_batches: Optional[int] = None,
        build_batch: Optional[int] = None,
    ) -> int:
        """Fold the executions written since the last fold into the counts of `parts`
        (default: the partitions this store works on), building a counter not built yet
        first: at most `build_batches` batches of it (None: all of it; a worker builds one
        batch a sweep) of `build_batch` documents (None: the default; 0: the rest in one
        pass); see `harel_beanie.core.counting`."""
        flow = flows.fold_counts(
            self._state.scope, parts, ids=ids, build_batches=build_batches, build_batch=build_batch
        )
        return await self._run(flow)

    async def read_counts(self) -> Optional[Counts]:
        """Exact counts of the stored executions by definition and status, or None where the
        counters cannot answer (another layout); while some partitions' counters are not
        built, the counts of the others, naming them in `Counts.unbuilt`."""
        read = await self._run(flows.read_counts(self._state.scope))
        return None if read is None else read[0]

    async def close(self) -> None:
        """Give the seq lease back (if it holds one) and close the client."""
        try:
            await self._drive(flows.release_lease(self._state))
        except PyMongoError:
            pass  # unreachable: the lease simply expires
        await maybe_await(self._client.close())


def _is_pymongo_async(client: Any) -> bool:
    try:
        from pymongo import AsyncMongoClient
    except ImportError:  # pragma: no cover - pymongo < 4.9
        return False
    return isinstance(client, AsyncMongoClient)
