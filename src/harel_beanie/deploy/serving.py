"""What a long-running worker runs beside harel's `AsyncWorker`: the loop that rides out a
server's outages, the periodic relay sweep and counts fold, and the worker's share of the
partitions (its first look before it says it is ready, and the leases it gives back on a
clean stop).

Why this module exists: `harel-beanie worker` and an app's own worker process need the same
pieces around harel's loop; the command only parses its flags and wires them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Optional

from pymongo.errors import BulkWriteError, ConnectionFailure, OperationFailure, WriteConcernError

from harel_beanie.deploy.relay import sweep
from harel_beanie.queries.server import server_of
from harel_beanie.transport.ownership import RENEW_EVERY, TAKEOVER_BOUND, PartitionOwner

log = logging.getLogger("harel_beanie.worker")


async def first_look(owner: PartitionOwner) -> None:
    """Look until this worker holds a share of the partitions, before it says it is ready:
    a worker restarted after a crash waits out its predecessor's leases here (at most
    `TAKEOVER_BOUND`), and one joining others gets its share as they give it back (within
    two looks). Past the bound, or on a failed look, it goes on: the owner's loop keeps
    looking, and until it holds a partition the worker claims and sweeps nothing."""
    deadline = time.monotonic() + TAKEOVER_BOUND + RENEW_EVERY
    while True:
        try:
            if await owner.tick() or time.monotonic() > deadline:
                return
        except (ConnectionFailure, OperationFailure) as exc:
            log.warning("first partition look failed: %s", exc)
            return
        await asyncio.sleep(RENEW_EVERY)


async def give_back(owner: PartitionOwner, wid: str) -> None:
    """A clean stop gives the leases back, so the others take them at their next look."""
    try:
        await owner.release()
    except (ConnectionFailure, OperationFailure):
        pass  # they lapse by themselves


async def sweep_forever(
    store: Any,
    transport: Any,
    executions: Any,
    worker: Any,
    every: float,
    stop: asyncio.Event,
    trace: bool,
    sample: Optional[Callable[[], Awaitable[Any]]] = None,
) -> None:
    """Every `every` seconds: the relay sweep, the counts fold, and `sample` (this minute's
    sample of the store, unless another worker or a dashboard took it: the views take the
    pending entries from it instead of reading every document that holds one)."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=every)
            return
        except asyncio.TimeoutError:
            pass
        try:
            await sweep(store, transport, executions, worker.definitions, worker.clock, trace=trace)
        except Exception as exc:  # an outage: the run loop will meet it too; keep sweeping after it
            _failed("relay sweep", exc, every)
        try:
            # the counts of the partitions this worker owns (core.counting): a counter not
            # built yet gets one batch a sweep, between the worker's other work; on a server
            # where `limit` bounds no work a batch's id read would read the collection, so
            # there the first sweep builds the rest in one pass (two reads of it)
            whole = not (await server_of(executions)).limit_bounds_work
            await store.fold_counts(build_batches=1, build_batch=0 if whole else None)
        except Exception as exc:  # as for the sweep: the next one folds what this one could not
            _failed("counts fold", exc, every)
        if sample is not None:
            try:
                await sample()
            except Exception as exc:  # the views read the entries themselves until a sample is taken
                _failed("per-minute sample", exc, every)


def _failed(what: str, exc: Exception, every: float) -> None:
    """A periodic task's failure, logged: a lost connection or a server error a retry can
    outlive (`passing`) in one line, anything else with its traceback."""
    expected = isinstance(exc, ConnectionFailure) or (isinstance(exc, OperationFailure) and passing(exc))
    log.warning("%s failed (%r); retrying in %ss", what, exc, every, exc_info=not expected)


async def run_through_outages(
    worker: Any, stop: asyncio.Event, wid: str, pause: float = 1.0, say: Callable[[str], Any] = print
) -> None:
    """harel's `AsyncWorker.run`, restarted when the server goes away: its claims and timer
    sweeps are outside its per-event error handling, so an outage ends the loop. Events in
    flight then come back after their lease, as after any worker crash. `say` gets the line
    a person reads about it."""
    while True:
        try:
            await worker.run(stop)
            return
        except ConnectionFailure as exc:  # refused, reset, no server selectable: wait it out
            if stop.is_set():
                return
            say(f"worker {wid}: lost the server ({type(exc).__name__}); retrying every {pause:g}s")
            log.warning("worker loop interrupted by %r", exc)
        except OperationFailure as exc:
            # a claim the server applied without the write concern it asked for (a member
            # lagging, a primary stepping down), or refused with a label saying a retry may
            # succeed: as passing as a lost connection, and what was leased comes back after
            # its lease.
            if not passing(exc):
                raise
            if stop.is_set():
                return
            say(f"worker {wid}: the server failed a command ({type(exc).__name__}); retrying")
            log.warning("worker loop interrupted by %r", exc)
        try:
            await asyncio.wait_for(stop.wait(), timeout=pause)
            return
        except asyncio.TimeoutError:
            pass


def passing(exc: OperationFailure) -> bool:
    """A server error that says nothing about the request itself, which a retry can outlive."""
    if isinstance(exc, BulkWriteError):
        # a bulk write (a claim of k groups) whose writes all went through, without the
        # write concern it asked for: as a single write's `WriteConcernError`
        details = exc.details or {}
        return not details.get("writeErrors") and bool(details.get("writeConcernErrors"))
    return isinstance(exc, WriteConcernError) or any(
        exc.has_error_label(label) for label in ("RetryableWriteError", "RetryableError")
    )


def share(owner: Optional[PartitionOwner]) -> str:
    """The partitions a worker holds, as the ready line says them."""
    if owner is None:
        return ""
    return f", partitions {len(owner.state.held)} of {owner.state.scope.parts} leased"
