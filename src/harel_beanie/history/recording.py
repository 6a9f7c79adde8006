"""`RecordingStore` and `RecordingTransport`: any harel async store or transport, with the
operations the checker judges recorded.

Why this module exists: the history has to record what the engine really asked of the store
and what it was told, under the faults of the run, without the engine knowing. The wrapper
sits between harel's `AsyncWorker` (or a runner) and the store, writes an invoke before each
recorded call and its outcome after, and hands everything else through untouched, so the
relays, the timer sweeps and the worker's own calls see the store they were given.

What is recorded, in the format of `harel_beanie.history.records`:

- a `commit` (or `save`) of an execution at version 0 is its `create`: harel creates an
  execution by committing it (with its `Start` in the outbox) or saving it at version 0;
- any other `commit` or `save` is a `commit` from the loaded version to the next, with the
  event it processed (`save` processes none);
- `load` and `load_for_event` are `read`s, with the version they found (null: none).

And by the transport, by group id and event id only (what every transport's groups have):

- a `publish` of an event to a group: invoke `group`, `event`, `kind`; `ok` once returned,
  `unknown` if it raised (it may be queued all the same);
- a `deliver`: a claim that returned a message, its invoke written as the claim returns
  (`group`, `event`, `kind`), completed `ok` when the message is acked (handled), `fail`
  when it is nacked (it comes back), `unknown` when the ack raised; a worker killed with
  the message in hand leaves it incomplete. Claims that return nothing are not written.

The store's outcome: returned is `ok`; harel's `StoreConflict` and `ExecutionAlreadyExists` are
`fail` (the store refused, nothing was written); any other exception is `unknown` (a timeout
or a dropped connection says nothing about whether the write landed). The exception is
always raised again: recording never changes what the caller sees.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from harel.engine.execution import Execution
from harel.engine.store import ExecutionAlreadyExists, StoreConflict

from harel_beanie.history.records import HistoryWriter


class RecordingStore:
    """`store` (a harel `AsyncExecutionStore`) with its creates, commits and reads written to
    `history`. Every other attribute is the wrapped store's."""

    def __init__(self, store: Any, history: HistoryWriter) -> None:
        self.inner = store
        self.history = history

    def __getattr__(self, name: str) -> Any:
        # only reached for what the class does not define: everything unrecorded
        if name == "load_for_event":
            # harel takes the one-round-trip read only from a store that offers it, so the
            # wrapper offers it exactly when the wrapped store does (AttributeError otherwise)
            return self._recorded_load_for_event(getattr(self.inner, name))
        return getattr(self.inner, name)

    async def load(self, execution_id: str) -> Optional[Execution]:
        i = self.history.invoke("read", exe=execution_id)
        try:
            exe = await self.inner.load(execution_id)
        except BaseException as exc:
            self._failed(i, exc)
            raise
        self.history.complete(i, "ok", version=None if exe is None else exe.version)
        return exe

    def _recorded_load_for_event(self, load_for_event: Any) -> Any:
        async def recorded(execution_id: str, event_id: str) -> tuple[Optional[Execution], bool]:
            i = self.history.invoke("read", exe=execution_id)
            try:
                exe, processed = await load_for_event(execution_id, event_id)
            except BaseException as exc:
                self._failed(i, exc)
                raise
            self.history.complete(i, "ok", version=None if exe is None else exe.version)
            return exe, processed

        return recorded

    async def save(self, exe: Execution) -> None:
        i, f = self._invoke_write(exe, None)
        try:
            await self.inner.save(exe)
        except BaseException as exc:
            self._failed(i, exc)
            raise
        self._landed(i, f, exe)

    async def commit(
        self, exe: Execution, emits: Any, processed_event_id: Optional[str] = None, *rest: Any, **more: Any
    ) -> Any:
        i, f = self._invoke_write(exe, processed_event_id)
        try:
            result = await self.inner.commit(exe, emits, processed_event_id, *rest, **more)
        except BaseException as exc:
            self._failed(i, exc)
            raise
        self._landed(i, f, exe)
        return result

    # --- the records ----------------------------------------------------------------------

    def _invoke_write(self, exe: Execution, event: Optional[str]) -> tuple[int, str]:
        if exe.version == 0:
            i = self.history.invoke(
                "create", exe=exe.id, definition=exe.definition_id, context=_plain(exe.context), parent=exe.parent_id
            )
            return i, "create"
        fields = {"from": exe.version, "to": exe.version + 1}  # `from` is a keyword: passed by name
        return self.history.invoke("commit", exe=exe.id, event=event, **fields), "commit"

    def _landed(self, i: int, f: str, exe: Execution) -> None:
        # the store moved `exe.version` to the version it now holds; a create's is 1
        if f == "create":
            self.history.complete(i, "ok", version=exe.version)
        else:
            self.history.complete(i, "ok", to=exe.version)

    def _failed(self, i: int, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, StoreConflict):
            self.history.complete(i, "fail", error=error, found=exc.found)
        elif isinstance(exc, ExecutionAlreadyExists):
            self.history.complete(i, "fail", error=error)
        else:
            # a timeout, a lost reply, a cancelled task: whatever was sent may have landed
            self.history.complete(i, "unknown", error=error)


class RecordingTransport:
    """`transport` (a harel async transport) with its publishes and deliveries written to
    `history`. Every other attribute is the wrapped transport's."""

    def __init__(self, transport: Any, history: HistoryWriter) -> None:
        self.inner = transport
        self.history = history
        self._held: dict[int, int] = {}  # id of a lease in hand -> its deliver's index

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def publish(self, group_id: str, event: Any, *args: Any, **kwargs: Any) -> None:
        i = self.history.invoke("publish", group=group_id, event=event.id, kind=event.kind)
        try:
            await self.inner.publish(group_id, event, *args, **kwargs)
        except BaseException as exc:
            self.history.complete(i, "unknown", error=f"{type(exc).__name__}: {exc}")
            raise
        self.history.complete(i, "ok")

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        lease = await self.inner.claim(*args, **kwargs)
        if lease is not None:
            event = lease.event
            self._held[id(lease)] = self.history.invoke(
                "deliver", group=lease.group_id, event=event.id, kind=event.kind
            )
        return lease

    async def ack(self, lease: Any, *args: Any, **kwargs: Any) -> None:
        await self._end(lease, self.inner.ack(lease, *args, **kwargs), "ok")

    async def nack(self, lease: Any, *args: Any, **kwargs: Any) -> None:
        await self._end(lease, self.inner.nack(lease, *args, **kwargs), "fail")

    async def _end(self, lease: Any, call: Any, outcome: str) -> None:
        i = self._held.pop(id(lease), None)
        try:
            await call
        except BaseException as exc:
            if i is not None:
                # an ack that raised may have landed; a nack that did not lets the lease run out:
                # either way the message was not handled here
                self.history.complete(i, "unknown" if outcome == "ok" else "fail", error=f"{type(exc).__name__}: {exc}")
            raise
        if i is not None:
            self.history.complete(i, outcome)


def _plain(value: Any) -> Any:
    """A JSON copy of a context as it is now (later actions keep changing the live one)."""
    return json.loads(json.dumps(value, default=str))
