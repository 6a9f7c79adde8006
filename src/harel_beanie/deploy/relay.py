"""Keeping harel's relay to the execution it belongs to, and sweeping what it leaves behind.

Why this module exists. When a harel `AsyncWorker` handles an event whose commit queued
outbox entries or child spawns, it relays them right after the commit: it reads *every*
pending entry in the store (`pending_outbox()`, `pending_spawns()` take no argument) and
creates each pending child with *the handled execution's* definition. With several events
in flight (`concurrency` > 1, or several workers) that goes wrong in two ways, both seen
when `harel-beanie demo` first ran the shop models:

- two relays create the same child; the second commit is a `StoreConflict`, the worker
  nacks the event, the redelivery finds it already processed and acks it, and the rest of
  that relay is never done: entries stay pending until some later event happens to relay,
  so the work stalls (an order waiting forever for its regions);
- a relay running for one machine (say a `PickLine`) can create another machine's pending
  orthogonal region (an `Order`'s `Fulfilment.Warehouse`) with the wrong definition.

So the commands run each handler's relay over `ScopedStore`: the store as it is, except
that the pending outbox and spawns it shows are those of the handled execution and its
descendants, by their `parent_id` chain: never those of another root whose id merely starts
like a child's (a user may name a root `a:b`; harel names `a`'s children `a:<path>:<n>`). What a relay still leaves
behind (a crash, a conflict) is picked up by `sweep`, which relays each owner's entries
with that owner's own definition. Nothing here changes what harel commits.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from harel.engine.aio.distributed import AsyncTransportDriver
from harel.engine.store import StoreConflict

from harel_beanie.core.arguments import require_bool, require_str
from harel_beanie.core.documents import PENDING
from harel_beanie.core.keys import ANY_SEQ

log = logging.getLogger(__name__)


class ScopedStore:
    """`store`, with `pending_outbox` / `pending_spawns` narrowed to `execution_id` and its
    descendants (the store's `within=` reads: the pending entries' index, then the holders'
    `parent_id` chain).

    With `own_spawns`, the spawns shown are only those `execution_id` itself holds: a
    descendant may run another machine (an invoked submachine) and its regions must be
    created with its definition, not this one's. The sweep, which visits every owner with
    its own definition anyway, relays that way."""

    def __init__(self, store: Any, execution_id: str, *, own_spawns: bool = False) -> None:
        self._store = store
        # the id ends up in the store's `within=` filter: a dict there would be an operator
        self._execution_id = require_str("execution_id", execution_id)
        self._own_spawns = require_bool("own_spawns", own_spawns)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def pending_outbox(self) -> list[Any]:
        return list(await self._store.pending_outbox(within=self._execution_id))

    async def pending_spawns(self) -> list[Any]:
        spawns = await self._store.pending_spawns(within=self._execution_id)
        if self._own_spawns:
            return [s for s in spawns if s.parent_id == self._execution_id]
        return list(spawns)


async def sweep(
    store: Any,
    transport: Any,
    executions: Any,
    definitions: dict[str, Any],
    clock: Callable[[], float] = time.time,
    trace: bool = False,
) -> int:
    """Relay the pending outbox and spawns of every execution in the partitions the store
    works on (`store.partitions`: all of them without an owner) with its own definition (each
    owner's pass creates only the children it spawned itself). Returns
    how many executions held any. A relay that conflicts with a handler doing the same is
    left for the next sweep. `trace` as the worker's: the children it starts record their
    first step too."""
    trace = require_bool("trace", trace)  # checked before anything is read
    owners: dict[str, Any] = {}
    scope = getattr(store, "partitions", None)
    scoped = scope.sweep_filter() if scope is not None else {}
    if scoped is None:
        return 0  # it owns no partition now: their owners sweep them
    queries = [{**PENDING, **scoped}]  # the flagged documents of the partitions it works on
    if getattr(store, "compat", False):  # harel's layout carries no flag: each array by itself
        queries = [{f"{array}.seq": ANY_SEQ, **scoped} for array in ("outbox", "spawns")]
    for query in queries:
        for doc in await executions.find(query, {"definition_id": 1}).to_list(None):
            owners[doc["_id"]] = doc
    for doc in owners.values():
        defn = definitions.get(doc.get("definition_id"))
        if defn is None:
            log.warning("cannot relay the pending work of %s: no definition %r", doc["_id"], doc.get("definition_id"))
            continue
        driver = AsyncTransportDriver(
            defn,
            ScopedStore(store, doc["_id"], own_spawns=True),
            transport,
            clock,
            definitions=definitions,
            resolve_machine=definitions.__getitem__,
            trace=trace,
        )
        try:
            await driver.recover()
        except StoreConflict:
            pass  # a handler is relaying it right now
    return len(owners)
