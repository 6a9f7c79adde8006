"""A store wrapper that measures commits and, optionally, traces every store operation with
OpenTelemetry, without changing the store itself.

Why this module exists: commit latency and conflicts can only be seen where commits happen,
and the store's core (flows, commit planning) is not the place for observability. harel's
runners call the store through its public methods only, so wrapping the store object is
enough: `InstrumentedStore(store, metrics=..., tracer=...)` is handed to harel in its place.

Spans follow OpenTelemetry's database semantic conventions: one span per store operation,
named `<operation> <collection>`, kind CLIENT, with `db.system.name` = `mongodb`,
`db.namespace` (the database), `db.collection.name` and `db.operation.name`, and
`error.type` when it fails. Only the OpenTelemetry *API* is used, and only if it is
installed: without an SDK configured by the app its tracer records nothing, and without the
package `otel_tracer()` returns None and no span is made.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from typing import Any, Callable, Iterator, Optional

from harel_beanie.core.arguments import require_str

#: the store operations harel calls (sync and async stores share the names)
OPERATIONS = (
    "load",
    "load_for_event",
    "list_executions",
    "save",
    "commit",
    "is_processed",
    "append_trace",
    "read_trace",
    "pending_outbox",
    "ack_outbox",
    "pending_spawns",
    "ack_spawn",
    "due_timers",
    "delete_timer",
    "ids_with_prefix",
    "purge",
)


def otel_tracer(name: str = "harel_beanie") -> Optional[Any]:
    """The OpenTelemetry API's tracer, or None when `opentelemetry-api` is not installed."""
    name = require_str("name", name)
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace.get_tracer(name)


class InstrumentedStore:
    """`store` (sync or async), with its commits timed into `metrics` (a
    `harel_beanie.telemetry.metrics.StoreMetrics`) and each operation in a span of `tracer`.
    Everything else is the wrapped store's, unchanged."""

    def __init__(self, store: Any, *, metrics: Optional[Any] = None, tracer: Optional[Any] = None) -> None:
        self._store = store
        self._metrics = metrics
        self._tracer = tracer
        settings = getattr(store, "settings", None)
        self._db = getattr(settings, "db_name", None)
        prefix = getattr(settings, "prefix", "harel")
        self._collection = f"{prefix}_executions"
        for name in OPERATIONS:
            method = getattr(store, name, None)
            if method is not None and (tracer is not None or name == "commit"):
                setattr(self, name, self._wrap(name, method))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @property
    def wrapped(self) -> Any:
        return self._store

    def _span(self, name: str) -> Any:
        attributes = {
            "db.system.name": "mongodb",
            "db.operation.name": name,
            "db.collection.name": self._collection,
        }
        if self._db:
            attributes["db.namespace"] = self._db
        kind: Any = None
        try:
            from opentelemetry.trace import SpanKind

            kind = SpanKind.CLIENT
        except ImportError:  # a tracer supplied without the package (a test double)
            pass
        kwargs: dict[str, Any] = {"attributes": attributes}
        if kind is not None:
            kwargs["kind"] = kind
        return self._tracer.start_as_current_span(f"{name} {self._collection}", **kwargs)  # type: ignore[union-attr]

    def _done(
        self, name: str, args: tuple[Any, ...], started: float, error: Optional[BaseException], span: Any
    ) -> None:
        if name == "commit" and self._metrics is not None:
            definition = getattr(args[0], "definition_id", "") if args else ""
            self._metrics.observe_commit(str(definition), time.perf_counter() - started, error)
        if span is not None and error is not None:
            span.set_attribute("error.type", type(error).__name__)
            try:
                from opentelemetry.trace import Status, StatusCode

                span.set_status(Status(StatusCode.ERROR, str(error)))
            except ImportError:
                pass

    @contextlib.contextmanager
    def _observed(self, name: str, args: tuple[Any, ...]) -> Iterator[None]:
        """One call of operation `name`: in its span (if tracing), timed, its error recorded."""
        cm = self._span(name) if self._tracer is not None else None
        span = cm.__enter__() if cm is not None else None
        started = time.perf_counter()
        error: Optional[BaseException] = None
        try:
            yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._done(name, args, started, error, span)
            if cm is not None:
                # the span ends here; an exception was recorded above, not re-raised by it
                cm.__exit__(None, None, None)

    def _wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(method):

            @functools.wraps(method)
            async def async_call(*args: Any, **kwargs: Any) -> Any:
                with self._observed(name, args):
                    return await method(*args, **kwargs)

            return async_call

        @functools.wraps(method)
        def sync_call(*args: Any, **kwargs: Any) -> Any:
            with self._observed(name, args):
                return method(*args, **kwargs)

        return sync_call
