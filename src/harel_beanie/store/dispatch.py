"""How a store makes a flow's calls, written once for the sync and the async store.

Running a flow is the same in both stores but for waiting: resume the flow with the last
reply (or throw the driver's error into it), take its next call, make that call on the
collection it targets. `FlowRun` is the first half and `start` the second: the collection
method each call is made with and what its answer becomes. `MongoStore` calls the method
and has the answer; `AsyncMongoStore` awaits it. A `Find` answers with a cursor, which
each store drains its own way (`list(cursor)`, `await cursor.to_list(None)`).
"""

from __future__ import annotations

import dataclasses
import inspect
from operator import attrgetter
from typing import Any, Awaitable, Callable, Generic, Mapping, Optional, Sequence

import pymongo
from pymongo import ReturnDocument
from pymongo.errors import PyMongoError

from harel_beanie.core import calls
from harel_beanie.core.calls import Flow, T
from harel_beanie.core.partitions import PartitionScope, route


class FlowRun(Generic[T]):
    """One flow being run: `next_call` resumes it with the reply to its last call (or the
    error that call raised) and returns its next call, or None once it has returned;
    its return value is then `result`."""

    result: T

    def __init__(self, flow: Flow[T]) -> None:
        self._flow = flow
        self._reply: Any = None
        self._error: Optional[BaseException] = None

    def next_call(self) -> Optional[calls.Call]:
        reply, error, self._reply, self._error = self._reply, self._error, None, None
        try:
            return self._flow.send(reply) if error is None else self._flow.throw(error)
        except StopIteration as done:
            self.result = done.value
            return None

    def reply(self, value: Any) -> None:
        """What the last call returned."""
        self._reply = value

    def fail(self, error: BaseException) -> None:
        """What the last call raised (a driver error), thrown into the flow."""
        self._error = error


def _as_is(answer: Any) -> Any:
    return answer


def _nothing(answer: Any) -> None:
    return None


_matched = attrgetter("matched_count")
_deleted = attrgetter("deleted_count")


def _touched(answer: Any) -> int:
    return int(answer.matched_count) + int(answer.deleted_count)


def _bulk_op(op: calls.Call) -> Any:
    if isinstance(op, calls.UpdateOne):
        return pymongo.UpdateOne(op.filter, op.update, upsert=op.upsert)
    if isinstance(op, calls.DeleteOne):
        return pymongo.DeleteOne(op.filter)
    raise TypeError(f"not a bulk write op: {op!r}")


@dataclasses.dataclass
class _Tally:
    """What `_one_by_one` did, shaped as a bulk write's result."""

    matched_count: int = 0
    deleted_count: int = 0

    def add(self, answer: Any) -> "_Tally":
        self.matched_count += int(getattr(answer, "matched_count", 0) or 0)
        self.deleted_count += int(getattr(answer, "deleted_count", 0) or 0)
        return self


def _fake(coll: Any) -> Optional[str]:
    """ "mongomock" or "mongomock_motor" for a collection of those in-memory fakes (the
    latter presents itself as Motor's: look along its bases), else None."""
    for k in type(coll).__mro__:
        if k.__module__.split(".")[0] in ("mongomock", "mongomock_motor"):
            return k.__module__.split(".")[0]
    return None


def _in_memory(coll: Any) -> bool:
    return _fake(coll) is not None


def _one_by_one(coll: Any, ops: Sequence[calls.Call]) -> Any:
    """A bulk write's ops sent one at a time, for an in-memory fake whose bulk write refuses
    PyMongo's operation objects; its answer is awaitable where the fake's calls are (an
    unordered bulk write promises no order, so one at a time keeps its meaning)."""
    answers = (start(coll, op)[0] for op in ops)
    if _fake(coll) != "mongomock_motor":
        tally = _Tally()
        for answer in answers:
            tally.add(answer)
        return tally

    async def awaited() -> _Tally:
        tally = _Tally()
        for answer in answers:
            tally.add(await answer)
        return tally

    return awaited()


def start(coll: Any, c: calls.Call) -> tuple[Any, Callable[[Any], Any]]:
    """Make call `c` on `coll`, a collection of any client with PyMongo's API (PyMongo's
    sync or async client, Motor, mongomock): the driver's answer (awaitable on an async
    client; a cursor for a `Find`), and what turns the settled answer into the reply the
    flow expects (see `harel_beanie.core.calls`)."""
    if isinstance(c, calls.FindOne):
        return coll.find_one(c.filter, c.projection), _as_is
    if isinstance(c, calls.Find):
        cursor = coll.find(c.filter, c.projection)
        if c.sort:
            cursor = cursor.sort(c.sort)
        if c.limit:
            cursor = cursor.limit(c.limit)
        return cursor, _as_is
    if isinstance(c, calls.UpdateOne):
        return coll.update_one(c.filter, c.update, upsert=c.upsert), _matched
    if isinstance(c, calls.InsertOne):
        return coll.insert_one(c.document), _nothing
    if isinstance(c, calls.ReplaceOne):
        return coll.replace_one(c.filter, c.replacement), _matched
    if isinstance(c, calls.UpdateMany):
        return coll.update_many(c.filter, c.update), _matched
    if isinstance(c, calls.DeleteOne):
        return coll.delete_one(c.filter), _deleted
    if isinstance(c, calls.BulkWrite):
        if _in_memory(coll):  # mongomock's bulk writes refuse PyMongo 4.9+'s operations
            return _one_by_one(coll, c.ops), _touched
        return coll.bulk_write([_bulk_op(op) for op in c.ops], ordered=False), _touched
    if isinstance(c, calls.Increment):
        inc = {"$inc": {c.field: c.by}}
        return coll.find_one_and_update({"_id": c.id}, inc, upsert=True, return_document=ReturnDocument.AFTER), _as_is
    if isinstance(c, calls.FindOneAndUpdate):
        after = ReturnDocument.AFTER if c.after else ReturnDocument.BEFORE
        answer = coll.find_one_and_update(
            c.filter, c.update, projection=c.projection, sort=c.sort, upsert=c.upsert, return_document=after
        )
        return answer, _as_is
    if isinstance(c, calls.Aggregate):
        return coll.aggregate(c.pipeline), _as_is
    if isinstance(c, calls.CreateIndexes):
        return (coll.create_indexes(c.indexes) if c.indexes else None), _nothing
    raise TypeError(f"unknown call {c!r}")


def routed(c: calls.Call, scope: Optional[PartitionScope]) -> calls.Call:
    """`c` with its filter naming its partition when commands go through a mongos
    (`harel_beanie.core.partitions.route`): one place for every flow of every shell."""
    if scope is None or not scope.sharded:
        return c
    if isinstance(c, calls.BulkWrite):  # each op names its own document
        ops = tuple(dataclasses.replace(op, filter=route(c.target, op.filter, scope) or op.filter) for op in c.ops)
        return dataclasses.replace(c, ops=ops)
    filter_ = getattr(c, "filter", None)
    if filter_ is None:
        return c
    changes: dict[str, Any] = {"filter": route(c.target, filter_, scope)}
    return dataclasses.replace(c, **changes)  # type: ignore[type-var]


def call(colls: Mapping[str, Any], c: calls.Call, scope: Optional[PartitionScope] = None) -> Any:
    """Make call `c` on the sync collection its target names in `colls`: the flow's reply.
    With `scope`, the call is routed first (`routed`)."""
    c = routed(c, scope)
    answer, reply = start(colls[c.target], c)
    return reply(list(answer) if isinstance(c, (calls.Find, calls.Aggregate)) else answer)


async def acall(colls: Mapping[str, Any], c: calls.Call, scope: Optional[PartitionScope] = None) -> Any:
    """`call` for an async client (PyMongo's async API, or Motor)."""
    c = routed(c, scope)
    answer, reply = start(colls[c.target], c)
    if isinstance(c, calls.Aggregate):  # PyMongo's async API answers a coroutine, Motor a cursor
        return reply(await (await maybe_await(answer)).to_list(None))
    return reply(await answer.to_list(None) if isinstance(c, calls.Find) else await maybe_await(answer))


def drive(flow: Flow[T], make: Callable[[calls.Call], Any]) -> T:
    """Run `flow` to its end, making each of its calls with `make` (a shell's `call` on its
    collections); a driver error is thrown into the flow, which decides what it means."""
    run = FlowRun(flow)
    while (c := run.next_call()) is not None:
        try:
            run.reply(make(c))
        except PyMongoError as exc:
            run.fail(exc)
    return run.result


async def adrive(flow: Flow[T], make: Callable[[calls.Call], Awaitable[Any]]) -> T:
    """`drive`, awaiting each call."""
    run = FlowRun(flow)
    while (c := run.next_call()) is not None:
        try:
            run.reply(await make(c))
        except PyMongoError as exc:
            run.fail(exc)
    return run.result


async def maybe_await(value: Any) -> Any:
    """PyMongo's async API returns coroutines where Motor returns plain values (aggregate,
    close, a `create_indexes` of nothing): accept both."""
    return await value if inspect.isawaitable(value) else value
