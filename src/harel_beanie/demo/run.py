"""`harel-beanie demo`: the shop workloads in `models/` run on the store as a deployment runs
them, so a newcomer sees the store do its job within a minute of cloning.

Why this module exists: on a fresh clone, `make demo` sets up, runs a few hundred
executions through harel's engine on our store, and shows what happened and where it is
kept. It runs the pure-Mongo stack: our `AsyncMongoStore`, harel's `AsyncMongoTransport` on
the same server, harel's `AsyncDistributedRunner` queueing the work and real
`AsyncWorker.run` loops claiming it with `--concurrency` events in flight. What it runs,
cycled until it has about `--executions` executions, is the shop mix of
`harel_beanie.demo.mix`; what it prints is `harel_beanie.demo.report`. This module drives
the run: the phases of the mix's script, the clock, waiting for the work to settle, and
the tally it hands to the report.

Timers: the run's clock is simulated — a `ManualClock` shared by the runner, the workers
and the transport, advanced by the demo to each next timer once the work before it is done.
It replays about a week of shop time (the mix's windows) ending at the real time the run
started: the orders whose parcels get lost are created a week back (their 7-day timer must
fire, which it does 35 minutes before the end), every other order in the last 25 minutes. So
a 15-minute or a 7-day timer fires at once, and right after a run its executions, but for
the lost orders' children (finished a week back), are the last hour's: a time search for the
last hour finds them, `prune --finished-before 1d` leaves them, and the dashboard's last-hour
charts draw them (the demo takes the charts' per-minute samples at the minutes of its clock
in that hour, as a dashboard running through it would have).

With no URL it starts the embedded server on `./harel-beanie-data` (`harel_beanie.deploy.where`),
so a second run finds the first run's executions (every run's ids start with its run id); an
interrupted run's are cleared first (`harel_beanie.demo.leftovers`).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any

from harel.engine.aio.distributed import AsyncDistributedRunner
from harel.engine.schema import Names
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from harel_beanie.core.errors import ConfigError
from harel_beanie.demo.charts import DemoSamples
from harel_beanie.demo.leftovers import fresh_command, record_finish, record_start, start_over
from harel_beanie.demo.mix import FULFIL_WINDOW, LOST_WINDOW, PAY_WINDOW, SPAN, STORY, Scenario, plan, root_id
from harel_beanie.demo.report import Result
from harel_beanie.demo.tally import earlier_runs, final_state, tally
from harel_beanie.deploy.loader import load_models
from harel_beanie.deploy.relay import sweep
from harel_beanie.deploy.stack import (
    LABEL,
    TRANSPORTS,
    CommandCounter,
    CountingWorker,
    open_client,
    open_transport,
    queued,
    refuse_if_stranded,
)
from harel_beanie.deploy.where import Target
from harel_beanie.harness.drivers import ManualClock, next_fire
from harel_beanie.store.async_store import AsyncMongoStore

FINISHED = ("DONE", "FAILED", "CANCELLED")


class DemoStalled(RuntimeError):
    """The work stopped moving; the message names the command that starts over."""


class DemoServerLost(RuntimeError):
    """The server stopped answering mid-run (stopped, killed); the message says what to run."""


class Demo:
    """One run: the planned mix, its run id, the shared clock, the round-trip counters."""

    def __init__(
        self,
        target: Target,
        models: Path,
        executions: int,
        workers: int,
        concurrency: int,
        console: Console,
        trace: bool = True,
        transport: str = TRANSPORTS[0],
        fresh: bool = False,
    ) -> None:
        self.target = target
        self.fresh = fresh  # drop the demo's database first (`harel_beanie.demo.leftovers`)
        self.transport_kind = transport
        self.models = models
        self.scenarios = plan(executions)
        self.workers_n = workers
        self.concurrency = concurrency
        self.console = console
        self.trace = trace
        self.run_id = f"demo-{secrets.token_hex(3)}"
        self.end = time.time()  # where the run's clock stops: the real time it started
        self.clock = ManualClock(start=self.end - SPAN)
        self.store_counter = CommandCounter()
        self.transport_counter = CommandCounter()
        self.roots = [(root_id(self.run_id, i, s), s) for i, s in enumerate(self.scenarios)]
        self.scenario_of = dict(self.roots)
        self.planned = sum(s.executions for s in self.scenarios)

    def definitions(self) -> dict[str, Any]:
        """The shop's machines (a run of other models is `harel_beanie.demo.explore`'s)."""
        definitions = load_models(self.models)
        missing = {"Order", "Payment"} - set(definitions)
        if missing:
            raise ConfigError(f"the shop's run needs the machines {sorted(missing)} in {self.models}")
        return definitions

    def root_ids(self) -> list[str]:
        return [eid for eid, _ in self.roots]

    async def run(self) -> Result:
        definitions = self.definitions()
        store_client = await open_client(self.target, listeners=[self.store_counter])
        store = AsyncMongoStore(store_client, self.target.db, prefix=self.target.prefix)
        self.store_executions = store_client[self.target.db][Names(self.target.prefix).executions]
        transport = poll = None
        try:
            # the demo's own looking (progress, settling) goes through a client of its own, uncounted
            self.client = await open_client(self.target)
            poll = AsyncMongoStore(self.client, self.target.db, prefix=self.target.prefix, beanie=False)
            said = await start_over(self.client, self.target, fresh=self.fresh)
            if said:
                self.console.print(said, markup=False, soft_wrap=True)  # one line, to find
            await store.init()
            await poll.init()
            await refuse_if_stranded(self.client[self.target.db], self.target.prefix, self.transport_kind)
            await record_start(self.client[self.target.db], self.target.prefix, self.run_id)
            transport = await open_transport(
                self.target,
                kind=self.transport_kind,
                clock=self.clock,
                listeners=[self.transport_counter],
                timers=store.next_timer,
            )
            result = await self._run(store, poll, transport, definitions)
            await record_finish(self.client[self.target.db], self.target.prefix, self.run_id)
            return result
        finally:
            await store.close()
            if poll is not None:
                await poll.close()
            if transport is not None:
                await transport.close()

    async def _run(self, store: Any, poll: Any, transport: Any, definitions: dict[str, Any]) -> Result:
        """The run: the workers started, the mix's phases sent with the clock advanced
        between them, the work waited for, and the tally.

        Kept whole: the phases share the workers, the clock and the tally; it reads as the
        script of the demo."""
        db = self.client[self.target.db]
        self.executions = db[Names(self.target.prefix).executions]
        self.samples = DemoSamples(db, self.target.prefix, self.clock, end=self.end)
        self.transport = transport
        self.poll = poll
        earlier = await self.executions.count_documents({})
        found = await earlier_runs(self.executions) if earlier else []

        sender = AsyncDistributedRunner(store, transport, definitions, clock=self.clock, trace=self.trace)
        workers = [
            CountingWorker(
                store,
                transport,
                definitions,
                worker_id=f"{self.run_id}-w{k + 1}",
                clock=self.clock,
                concurrency=self.concurrency,
                trace=self.trace,
                executions=self.store_executions,
            )
            for k in range(self.workers_n)
        ]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(w.run(stop)) for w in workers]  # created before LABEL is set
        started = time.perf_counter()
        self.workers = workers
        self.relay = lambda: sweep(
            store, transport, self.store_executions, workers[0].definitions, self.clock, trace=self.trace
        )
        progress = Progress(
            TextColumn("[bold]{task.description:<26}"),
            BarColumn(bar_width=18),
            MofNCompleteColumn(),
            TextColumn("executions done · {task.fields[events]} events"),
            console=self.console,
            disable=not self.console.is_terminal,  # piped: a line a phase instead (`_phase`)
        )
        LABEL.set("driver")
        try:
            with progress:
                self.progress = progress
                self.bar = progress.add_task("creating orders", total=self.planned, events=0)
                ticker = asyncio.create_task(self._tick())
                try:
                    await self._script(sender)
                finally:
                    ticker.cancel()
                    await self._refresh()
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in tasks:
            if t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        elapsed = time.perf_counter() - started
        return await tally(self, self.root_ids(), self.ending, elapsed, earlier, found)

    async def _script(self, sender: AsyncDistributedRunner) -> None:
        start = self.clock()
        week = [r for r in self.roots if r[1].waits_a_week]
        if week:
            await self._story(sender, week, "a week ago: ")
            self._phase("a week later: lost parcels")
            await self.timers(LOST_WINDOW)
        self._move_clock(start + STORY + LOST_WINDOW)  # the last `STORY`, ending now
        await self.samples.take()
        await self._story(sender, [r for r in self.roots if not r[1].waits_a_week], "")
        await self._refresh()  # the counts the last line shows
        self._phase("done")
        # to the real time now: the run took real seconds, and the minutes since are this state's
        await self.samples.take(until=time.time())

    async def _story(self, sender: AsyncDistributedRunner, roots: list[tuple[str, Scenario]], when: str) -> None:
        """One batch of orders from creation to delivery (`STORY` seconds of shop time).
        Kept whole: it reads as the script of the shop's hour."""
        gate = asyncio.Semaphore(16)

        async def each(items: list[tuple[str, Scenario]], fn: Any) -> None:
            async def one(eid: str, s: Scenario) -> None:
                async with gate:
                    await fn(eid, s)

            await asyncio.gather(*(one(eid, s) for eid, s in items))

        async def create(eid: str, s: Scenario) -> None:
            await sender.create(s.definition_id, s.context(eid), execution_id=eid)

        async def seal(eid: str, s: Scenario) -> None:
            await sender.send(eid, s.sealed(eid))

        async def deliver(eid: str, s: Scenario) -> None:
            for event in s.delivery(eid):
                await sender.send(eid, event)

        self._phase(when + "creating orders")
        await each(roots, create)
        self._phase(when + "paying (retries on timers)")
        await self.timers(PAY_WINDOW)
        if any(s.cancel for _, s in roots):
            self._phase(when + "cancelling some")
            for eid, s in roots:  # one at a time: a cancel relays inline, on this runner
                if s.cancel:
                    await sender.cancel(eid)
        self._phase(when + "cooling off, picking")
        await self.timers(FULFIL_WINDOW)
        self._phase(when + "packing")
        await each([r for r in roots if r[1].seal], seal)
        await self.settle()
        if any(s.deliver for _, s in roots):
            self._phase(when + "shipping, delivering")
            await each([r for r in roots if r[1].deliver], deliver)
            await self.settle()

    def _phase(self, text: str) -> None:
        self.progress.update(self.bar, description=text)
        if not self.console.is_terminal:  # piped: no bar is drawn, so a line a phase
            task = next(t for t in self.progress.tasks if t.id == self.bar)
            at = time.strftime("%a %H:%M", time.localtime(self.clock()))
            done = f"{int(task.completed)}/{int(task.total or 0)} done"
            self.console.print(f"  {at}  {text:<40} {done}", highlight=False, markup=False)

    async def timers(self, within: float) -> None:
        """Let `within` seconds of shop time pass: settle, jump the clock to the next armed
        timer in the window (a worker's idle sweep fires it), settle, and so on."""
        horizon = self.clock() + within
        while True:
            await self.settle()
            ahead = next_fire(await self.poll.due_timers(horizon), self.clock())
            await self.samples.take(until=horizon if ahead is None else ahead)
            if ahead is None:
                self._move_clock(horizon)
                await self.settle()
                return
            self._move_clock(ahead)

    def _move_clock(self, to: float) -> None:
        """Jump the shared clock; idle claims waiting on the old time look again at once."""
        self.clock.set(to)
        wake = getattr(self.transport, "wake", None)
        if wake is not None:
            wake()

    async def _pending(self) -> tuple[int, int, int, int]:
        return (
            await queued(self.client[self.target.db], self.target.prefix, self.transport_kind),
            len(await self.poll.pending_outbox()),
            len(await self.poll.pending_spawns()),
            len(await self.poll.due_timers(self.clock())),
        )

    async def settle(self, stall: float = 20.0) -> None:
        """Wait until nothing is queued, pending or due. A message parked for later (the
        worker's `suspend_recheck`) comes back when the clock moves, so a queue that stops
        moving gets the clock nudged; one that still does not move is a stall."""
        last: Any = None
        since = time.monotonic()
        nudged = 0
        while True:
            now = await self._pending()
            if now == (0, 0, 0, 0):
                await asyncio.sleep(0.02)
                if await self._pending() == (0, 0, 0, 0):
                    return
            if now != last:
                last, since = now, time.monotonic()
            elif not now[0] and (now[1] or now[2]) and time.monotonic() - since > 0.3:
                # entries no relay is working on (see harel_beanie.deploy.relay): relay them
                token = LABEL.set("sweep")
                try:
                    await self.relay()
                finally:
                    LABEL.reset(token)
                last = None
            elif time.monotonic() - since > stall / 4 and now[0] and nudged < 4:
                self.clock.advance(5.0)
                nudged += 1
                since = time.monotonic()
            elif time.monotonic() - since > stall:
                raise DemoStalled(
                    f"the work stopped moving (queued, outbox, spawns, due timers: {now}); work left by an "
                    f"earlier run stalls it: start over with `{fresh_command(self.target)}`"
                )
            await asyncio.sleep(0.05)

    async def _tick(self) -> None:
        while True:
            await self._refresh()
            await asyncio.sleep(0.25)

    async def _refresh(self) -> None:
        mine = {"_id": {"$regex": f"^{self.run_id}-"}}
        seen = await self.executions.count_documents(mine)
        done = await self.executions.count_documents({**mine, "status": {"$in": list(FINISHED)}})
        events = sum(w.handled for w in self.workers)
        self.progress.update(self.bar, total=max(self.planned, seen), completed=done, events=events)

    def ending(self, eid: str, doc: dict[str, Any]) -> tuple[str, str, str, bool]:
        """A shop root's ending: its scenario's, and the final state its model must end it in."""
        s = self.scenario_of[eid]
        got = final_state(doc)
        return s.name, s.expect, got, got == s.expect
