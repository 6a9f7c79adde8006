"""A worker process for the crash tests: `harel-beanie worker` on a shared, scaled clock.

    python -m tests.crash_worker --url URL --db DB --definitions models --clock FILE [...]

It runs what `harel_beanie.worker.serve` runs — harel's `AsyncWorker` (the package's
`CountingWorker`: each handler's relay scoped to its execution) on our `AsyncMongoStore` and
harel's `AsyncMongoTransport`, a relay sweep (`harel_beanie.relay.sweep`) once at start and
every `--sweep-every` seconds — with one difference: the worker, the transport and the
sweeps take the time from the clock file the test writes (`tests/crash_clock.py`), so the
models' long timers fire in seconds and every incarnation of the worker agrees on the time.
The `harel-beanie worker` command has no clock option, hence this script.

It prints `ready` once it can claim work. SIGTERM stops it cleanly (in-flight events finish);
the tests mostly SIGKILL it. If the run loop fails (the server went away), it exits 1 with
the traceback on stderr, as the command does: whoever supervises it starts it again.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import Any

from harel.engine.schema import Names

from harel_beanie.async_store import AsyncMongoStore
from harel_beanie.connect import RetryPolicy
from harel_beanie.relay import sweep
from harel_beanie.stack import CountingWorker, open_client, open_transport
from harel_beanie.where import Target
from harel_beanie.worker import load_definitions
from tests.crash_clock import SharedClock

log = logging.getLogger("crash_worker")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="crash_worker")
    p.add_argument("--url", required=True)
    p.add_argument("--db", required=True)
    p.add_argument("--prefix", default="harel")
    p.add_argument("--definitions", required=True)
    p.add_argument("--clock", required=True, help="the clock file (tests/crash_clock.py)")
    p.add_argument("--worker-id", default=f"crash-{os.getpid()}")
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--visibility", type=float, default=30.0, help="lease, in clock seconds")
    p.add_argument("--recheck", type=float, default=5.0, help="nack delay after a failure, in clock seconds")
    p.add_argument("--sweep-every", type=float, default=2.0, help="relay sweep period, real seconds")
    p.add_argument("--connect-timeout-ms", type=int, default=1000, help="server selection timeout (the CLI's)")
    return p.parse_args(argv)


async def _sweeps(store: Any, transport: Any, executions: Any, worker: Any, clock: Any, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            await sweep(store, transport, executions, worker.definitions, clock)
        except Exception:
            log.warning("relay sweep failed", exc_info=True)


async def serve(args: argparse.Namespace) -> int:
    clock = SharedClock(args.clock)
    target = Target(
        url=args.url,
        db=args.db,
        prefix=args.prefix,
        retry=RetryPolicy(attempts=120, delay=0.5, timeout_ms=args.connect_timeout_ms),
        source="--url",
    )
    definitions = load_definitions(args.definitions)
    client = await open_client(target)
    store = AsyncMongoStore(client, target.db, prefix=target.prefix)
    transport = None
    try:
        await store.init()
        transport = await open_transport(target, clock=clock)
        executions = client[target.db][Names(target.prefix).executions]
        worker = CountingWorker(
            store,
            transport,
            definitions,
            worker_id=args.worker_id,
            visibility=args.visibility,
            suspend_recheck=args.recheck,
            clock=clock,
            concurrency=args.concurrency,
            trace=True,
            executions=executions,
        )
        await sweep(store, transport, executions, worker.definitions, clock)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        sweeper = asyncio.create_task(_sweeps(store, transport, executions, worker, clock, args.sweep_every))
        print("ready", flush=True)
        try:
            await worker.run(stop)
        finally:
            sweeper.cancel()
            await asyncio.gather(sweeper, return_exceptions=True)
        print(f"stopped after {worker.handled} events", flush=True)
        return 0
    finally:
        await store.close()
        if transport is not None:
            await transport.close()


def main(argv: list[str]) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
