"""Drivers for tests and the benchmark: harel's own runners replaying a script on a store.

Why this module exists: the store is only worth something if harel's engine runs real
machines on it — invokes, forks and joins, fan-outs, durable timers, the outbox, the
control plane. The engine tests, the demo command and the benchmark need the same pieces,
written once here (loading the models they run is `harel_beanie.deploy.loader`'s job):

- Drivers with one shape over harel's three ways of running a machine: `SyncDurable`
  (`DurableRunner` over a sync store), `AsyncDurable` (`AsyncDurableRunner` over an async
  store) and `AsyncWorkerDriver` (`AsyncDistributedRunner` queues onto a transport, an
  `AsyncWorker` processes it; stepped until the transport is drained, so every call returns
  once the work it caused is done).
- A `ManualClock` that every runner, worker and transport of a run shares, so a durable
  timer fires when the script advances the clock (`Timers`), not when the wall clock says —
  runs are deterministic and take no real time. A script (`Create`, `Send`, `Timers`,
  `Control`) replays the same workload on any driver; `harel_beanie.harness.snapshots` reads back
  what a store holds at the end, for comparing runs on different stores.

Nothing here is Mongo-specific except `open_mongo_transport` (harel's `AsyncMongoTransport`,
the deployment's queue, opened by `harel_beanie.deploy.stack`): the drivers take any harel store
or transport. Scripts and drivers stay in one module: a script step means what a driver
does with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence, Union

from harel.definition.model import Definition
from harel.engine.aio.distributed import AsyncDistributedRunner, AsyncWorker
from harel.engine.aio.durable import AsyncDurableRunner
from harel.engine.durable import DurableRunner
from harel.engine.schema import DEFAULT_PREFIX
from harel.spec.states import Event

from harel_beanie.deploy.stack import open_transport
from harel_beanie.deploy.where import Target
from harel_beanie.store.connect import RetryPolicy

# A clock start far from 0, so timestamps look like real epoch seconds.
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z

CONTROL_COMMANDS = ("cancel", "terminate", "suspend", "resume", "purge")


# --- the clock ---------------------------------------------------------------------------


class ManualClock:
    """A clock that moves only when told. Pass the same one to the runner, the worker and
    the transport of a run."""

    def __init__(self, start: float = EPOCH) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self.now += seconds
        return self.now

    def set(self, when: float) -> float:
        """Move forward to `when` (no-op if that is already past)."""
        self.now = max(self.now, float(when))
        return self.now


# --- scripts -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Create:
    definition_id: str
    execution_id: str
    context: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Send:
    """Deliver one event. `event_id` is the dedupe key: sending the same id twice is one
    redelivered event, processed once."""

    execution_id: str
    kind: str
    event_id: str
    data: dict[str, Any] = field(default_factory=dict)

    def event(self) -> Event:
        return Event(id=self.event_id, kind=self.kind, data=dict(self.data))


@dataclass(frozen=True)
class Timers:
    """Let `within` seconds pass: the clock jumps to each timer due in that window in turn
    and fires it (what fires may arm further timers, fired too if they fall in the window)."""

    within: float


@dataclass(frozen=True)
class Control:
    command: str  # one of CONTROL_COMMANDS
    execution_id: str

    def __post_init__(self) -> None:
        if self.command not in CONTROL_COMMANDS:
            raise ValueError(f"unknown control command {self.command!r}")


Step = Union[Create, Send, Timers, Control]


def order_steps(
    order_id: str,
    lines: Sequence[str] = ("SKU-1", "SKU-2"),
    *,
    amount: float = 59.9,
    card: str = "visa",
    flaky_attempts: int = 0,
    scans: int = 2,
) -> list[Step]:
    """An `Order` (models/order.stm) from checkout to delivery: payment (retried on the
    gateway's failures), the cooling-off window, picking, the sealed parcel, carrier
    scans, delivery. With a short line or a refused card it ends early, as the model says."""
    steps: list[Step] = [
        Create(
            "Order",
            order_id,
            {
                "order_id": order_id,
                "amount": amount,
                "lines": list(lines),
                "card": card,
                "flaky_attempts": flaky_attempts,
            },
        ),
        Timers(within=3600),  # payment retries + the 15-minute cooling-off
        Send(order_id, "ParcelSealed", f"{order_id}:sealed", {"weight_g": 250 * len(lines)}),
    ]
    steps += [Send(order_id, "Scan", f"{order_id}:scan:{i}", {"hub": f"HUB-{i}"}) for i in range(scans)]
    steps.append(Send(order_id, "Delivered", f"{order_id}:delivered", {"signed_by": "front desk"}))
    return steps


# --- drivers -----------------------------------------------------------------------------


class SyncDurable:
    """harel's sync `DurableRunner` over a sync store: each call returns once the event and
    everything it relayed (children, outbox) is committed. `execution` is the runner's:
    "background" (harel's event loop thread) or "inline" (this thread)."""

    def __init__(
        self,
        store: Any,
        definitions: dict[str, Definition],
        clock: ManualClock,
        *,
        execution: str = "background",
        trace: bool = True,
    ) -> None:
        self.store = store
        self.clock = clock
        self.runner = DurableRunner(store, dict(definitions), clock=clock, trace=trace, execution=execution)

    def create(self, definition_id: str, execution_id: str, context: dict[str, Any]) -> Any:
        return self.runner.create(definition_id, context, execution_id=execution_id)

    def send(self, execution_id: str, event: Event) -> Any:
        return self.runner.process(execution_id, event)

    def fire_due_timers(self) -> int:
        return self.runner.fire_due_timers()

    def control(self, command: str, execution_id: str) -> Any:
        return getattr(self.runner, command)(execution_id)

    def timers(self, within: float, max_fires: int = 1000) -> int:
        """See `Timers`. Returns how many timers fired."""
        horizon = self.clock() + within
        fired = self.fire_due_timers()
        while fired < max_fires:
            nxt = next_fire(self.store.due_timers(horizon), self.clock())
            if nxt is None:
                return fired
            self.clock.set(nxt)
            fired += self.fire_due_timers()
        raise RuntimeError(f"more than {max_fires} timers fired within {within}s")

    def run(self, steps: Iterable[Step]) -> None:
        for step in steps:
            if isinstance(step, Create):
                self.create(step.definition_id, step.execution_id, step.context)
            elif isinstance(step, Send):
                self.send(step.execution_id, step.event())
            elif isinstance(step, Timers):
                self.timers(step.within)
            else:
                self.control(step.command, step.execution_id)


class _AsyncDriver:
    """The async drivers' shared script runner and timer sweep."""

    store: Any
    clock: ManualClock

    async def create(self, definition_id: str, execution_id: str, context: dict[str, Any]) -> Any:
        raise NotImplementedError

    async def send(self, execution_id: str, event: Event) -> Any:
        raise NotImplementedError

    async def fire_due_timers(self) -> int:
        raise NotImplementedError

    async def control(self, command: str, execution_id: str) -> Any:
        raise NotImplementedError

    async def timers(self, within: float, max_fires: int = 1000) -> int:
        """See `Timers`. Returns how many timers fired."""
        horizon = self.clock() + within
        fired = await self.fire_due_timers()
        while fired < max_fires:
            nxt = next_fire(await self.store.due_timers(horizon), self.clock())
            if nxt is None:
                return fired
            self.clock.set(nxt)
            fired += await self.fire_due_timers()
        raise RuntimeError(f"more than {max_fires} timers fired within {within}s")

    async def run(self, steps: Iterable[Step]) -> None:
        for step in steps:
            if isinstance(step, Create):
                await self.create(step.definition_id, step.execution_id, step.context)
            elif isinstance(step, Send):
                await self.send(step.execution_id, step.event())
            elif isinstance(step, Timers):
                await self.timers(step.within)
            else:
                await self.control(step.command, step.execution_id)


class AsyncDurable(_AsyncDriver):
    """harel's `AsyncDurableRunner` over an async store (same contract as `SyncDurable`)."""

    def __init__(
        self, store: Any, definitions: dict[str, Definition], clock: ManualClock, *, trace: bool = True
    ) -> None:
        self.store = store
        self.clock = clock
        self.runner = AsyncDurableRunner(store, dict(definitions), clock=clock, trace=trace)

    async def create(self, definition_id: str, execution_id: str, context: dict[str, Any]) -> Any:
        return await self.runner.create(definition_id, context, execution_id=execution_id)

    async def send(self, execution_id: str, event: Event) -> Any:
        return await self.runner.process(execution_id, event)

    async def fire_due_timers(self) -> int:
        return await self.runner.fire_due_timers()

    async def control(self, command: str, execution_id: str) -> Any:
        return await getattr(self.runner, command)(execution_id)


class AsyncWorkerDriver(_AsyncDriver):
    """harel's distributed pair over an async store and a transport: `AsyncDistributedRunner`
    (`sender`) creates executions and queues events, commands and due timers onto the
    transport; `AsyncWorker` (`worker`) claims and processes them. Every call here ends by
    stepping the worker until nothing is claimable (`drain`), so, like the durable drivers,
    it returns once the work it caused is done. A message parked by the worker (an event for
    a suspended execution) comes back once the clock passes `suspend_recheck` (see
    `control`)."""

    def __init__(
        self,
        store: Any,
        transport: Any,
        definitions: dict[str, Definition],
        clock: ManualClock,
        *,
        trace: bool = True,
        suspend_recheck: float = 5.0,
        worker_id: str = "worker-1",
    ) -> None:
        self.store = store
        self.transport = transport
        self.clock = clock
        self.suspend_recheck = suspend_recheck
        self.sender = AsyncDistributedRunner(store, transport, dict(definitions), clock=clock, trace=trace)
        self.worker: AsyncWorker = self.sender.worker(worker_id=worker_id, suspend_recheck=suspend_recheck)

    async def drain(self, max_steps: int = 100_000) -> int:
        """Step the worker until the transport has nothing claimable; returns the steps."""
        for n in range(max_steps):
            if not await self.worker.step():
                return n
        raise RuntimeError(f"the transport still had work after {max_steps} steps")

    async def create(self, definition_id: str, execution_id: str, context: dict[str, Any]) -> Any:
        await self.sender.create(definition_id, context, execution_id=execution_id)
        await self.drain()
        return await self.store.load(execution_id)

    async def send(self, execution_id: str, event: Event) -> Any:
        await self.sender.send(execution_id, event)
        await self.drain()
        return await self.store.load(execution_id)

    async def fire_due_timers(self) -> int:
        fired = await self.worker.fire_due_timers()
        await self.drain()
        return fired

    async def control(self, command: str, execution_id: str) -> Any:
        """Run a control command. After `resume`, a second more than `suspend_recheck`
        passes first: the worker parked what came for the execution while it was suspended
        (events, fired timers), and that is when a real worker would see it again (harel's
        in-memory transport releases a parked message only once its park has strictly
        passed)."""
        result = await getattr(self.sender, command)(execution_id)
        if command == "resume":
            self.clock.advance(self.suspend_recheck + 1)
        await self.drain()
        return result


async def open_mongo_transport(
    url: str, db_name: str, *, clock: Any = None, prefix: str = DEFAULT_PREFIX, kind: str = "harel", **options: Any
) -> Any:
    """A transport on a new client for `url`, opened the way the commands open it
    (`harel_beanie.deploy.stack.open_transport`): harel's `AsyncMongoTransport` (`harel[mongo]`)
    unless `kind="beanie"` asks for this package's. `clock` defaults to the wall clock; pass
    the run's `ManualClock` to replay a script. Close it with `await t.close()`."""
    target = Target(url, db_name, prefix, RetryPolicy(), source="driver")
    return await open_transport(target, kind=kind, clock=clock or time.time, **options)


def next_fire(due: Sequence[tuple[str, str, float]], now: float) -> Optional[float]:
    """The earliest fire time in `due` (a store's `due_timers`) still ahead of `now` (timers at or before it already had their
    chance: one left armed belongs to a suspended execution and waits for its resume)."""
    ahead = [fire_at for _eid, _path, fire_at in due if fire_at > now]
    return min(ahead) if ahead else None
