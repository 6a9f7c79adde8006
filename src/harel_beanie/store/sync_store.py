"""`MongoStore`: harel's `ExecutionStore` over PyMongo's sync `MongoClient`, for harel's
sync `DurableRunner`. A thin shell: it makes the calls the flows in `harel_beanie.core.flows`
ask for (each as `harel_beanie.store.dispatch` says) and nothing else.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable, Optional, Sequence

from harel.engine.execution import Execution, ExecutionPage, Status
from harel.engine.store.base import OutboxEntry, SpawnEntry, Step, TimerOp
from harel.spec.states import Event
from pymongo.errors import PyMongoError

from harel_beanie.core import calls, flows
from harel_beanie.core.calls import Flow, T
from harel_beanie.core.commit import CommitRequest
from harel_beanie.core.counting import Counts
from harel_beanie.store.connect import RetryPolicy, wait_for_server
from harel_beanie.store.dispatch import call, drive
from harel_beanie.store.settings import StoreShell
from harel_beanie.store.sharding import routing_check


class MongoStore(StoreShell):
    """A durable harel `ExecutionStore` on MongoDB, one document per execution.

    `client` is a `pymongo.MongoClient` (or a mongomock one). Collections are
    `<prefix>_executions` and `<prefix>_counters` in `db_name`, as harel names them."""

    # one set-up at a time, across instances: it runs once per store, so sharing is free
    _setup_lock = threading.Lock()

    @classmethod
    def from_url(
        cls,
        url: str,
        db_name: str = "harel",
        connect_retries: Optional[int] = None,
        retry_delay: Optional[float] = None,
        *,
        retry: RetryPolicy = RetryPolicy(),
        client_options: Optional[dict[str, Any]] = None,
        **options: Any,
    ) -> "MongoStore":
        """Build a `MongoClient` for `url`, wait until the server answers a ping (retrying
        per `retry`), and return a store on it. `connect_retries` and
        `retry_delay`, as harel's store takes them, override `retry`'s attempts and delay.
        `client_options` go to the client (e.g. `event_listeners`, `tls`); `options` to
        the store. Raises `StoreUnavailable` naming the URL, password masked, if it never does."""
        from pymongo import MongoClient

        retry = retry.overridden(connect_retries, retry_delay)
        settings = retry.client_settings(client_options)
        return cls(wait_for_server(lambda: MongoClient(url, **settings), url, retry), db_name, **options)

    # --- the driver: make each call a flow asks for ----------------------------------------

    def init(self) -> None:
        """Set the store up now (indexes, layout check, seq node) instead of on first use."""
        with self._setup_lock:
            if not self._state.ready:
                if self._detect_mongos:
                    self._state.scope.sharded = routing_check(self._client, self.settings.db_name, self.settings.prefix)
                    self._detect_mongos = False
                self._drive(flows.setup(self._state))

    def _run(self, flow: Flow[T]) -> T:
        if not self._state.ready:
            self.init()
        with self._state.operation():  # every operation counts (flows.relays: one relay read, not two)
            return self._drive(flow)

    def _drive(self, flow: Flow[T]) -> T:
        return drive(flow, self._call)

    def _call(self, c: calls.Call) -> Any:
        return call(self._colls, c, self._state.scope)

    # --- ExecutionStore ---------------------------------------------------------------------

    def load(self, execution_id: str) -> Optional[Execution]:
        return self._run(flows.load(self._state, execution_id))

    def load_for_event(self, execution_id: str, event_id: str) -> tuple[Optional[Execution], bool]:
        """The execution and whether it already processed `event_id`, in one round trip."""
        return self._run(flows.load_for_event(self._state, execution_id, event_id))

    def list_executions(
        self,
        *,
        status: Optional[Iterable[Status]] = None,
        definition_id: Optional[str] = None,
        roots_only: bool = False,
        limit: int = 100,
        cursor: Optional[str] = None,
    ) -> ExecutionPage:
        return self._run(flows.list_executions(self._state, status, definition_id, roots_only, limit, cursor))

    def save(self, exe: Execution) -> None:
        self.commit(exe, [])

    def commit(
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
        return self._run(flows.commit(self._state, request))

    def is_processed(self, execution_id: str, event_id: str) -> bool:
        return self._run(flows.is_processed(self._state, execution_id, event_id))

    def append_trace(self, execution_id: str, entry: dict[str, Any]) -> None:
        self._run(flows.append_trace(self._state, execution_id, entry))

    def read_trace(self, execution_id: str) -> list[dict[str, Any]]:
        return self._run(flows.read_trace(self._state, execution_id))

    def pending_outbox(self, *, within: Optional[str] = None) -> list[OutboxEntry]:
        """Pending entries, oldest first; `within` an execution id: only those of that
        execution and its descendants (what one execution's relay should see)."""
        return self._run(flows.pending_outbox(self._state, within))

    def ack_outbox(self, seq: int) -> None:
        self._run(flows.ack_outbox(self._state, seq))

    def pending_spawns(self, *, within: Optional[str] = None) -> list[SpawnEntry]:
        """Pending entries, oldest first; `within` an execution id: only those of that
        execution and its descendants (what one execution's relay should see)."""
        return self._run(flows.pending_spawns(self._state, within))

    def ack_spawn(self, seq: int) -> None:
        self._run(flows.ack_spawn(self._state, seq))

    def due_timers(self, now: float) -> list[tuple[str, str, float]]:
        return self._run(flows.due_timers(self._state, now))

    def next_timer(self, after: float) -> Optional[float]:
        """The earliest timer bound later than `after` (epoch seconds), or None: when an idle
        worker should next sweep for due timers."""
        return self._run(flows.next_timer(self._state, after))

    def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None:
        self._run(flows.delete_timer(self._state, execution_id, path, fire_at))

    def ids_with_prefix(self, prefix: str) -> list[str]:
        return self._run(flows.ids_with_prefix(self._state, prefix))

    def purge(self, execution_id: str, expected_version: int) -> bool:
        return self._run(flows.purge(self._state, execution_id, expected_version))

    def fold_counts(
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
        return self._run(flow)

    def read_counts(self) -> Optional[Counts]:
        """Exact counts of the stored executions by definition and status, or None where the
        counters cannot answer (another layout); while some partitions' counters are not
        built, the counts of the others, naming them in `Counts.unbuilt`."""
        read = self._run(flows.read_counts(self._state.scope))
        return None if read is None else read[0]

    def close(self) -> None:
        """Give the seq lease back (if it holds one) and close the client."""
        try:
            self._drive(flows.release_lease(self._state))
        except PyMongoError:
            pass  # unreachable: the lease simply expires
        self._client.close()
