"""`harel-beanie worker`: a long-running harel `AsyncWorker` on this store and a transport on
the same server (this package's own by default, harel's Mongo transport with
`--transport harel`) — what a deployment runs, N replicas of it.

Why this module exists: harel's own worker (`python -m harel.worker`) builds harel's
`AsyncMongoStore` for `HAREL_STORE_BACKEND=mongo`; it cannot be pointed at another store.
This is the same loop on ours, configured the same way: the `HAREL_*` variables harel's
worker reads (`HAREL_DEFINITIONS_DIR`, `HAREL_MONGO_URL`, `HAREL_MONGO_DB`, `HAREL_PREFIX`,
`HAREL_CONCURRENCY`, `HAREL_WORKER_ID`, `HAREL_VISIBILITY`, `HAREL_TRACE`, `HAREL_TRACE_MAX`,
`HAREL_CREATE_SCHEMA`), each overridable by a flag.

What it adds to harel's loop:

- It prints one line when it is ready to claim work (`worker <id> ready: ...`), so a
  supervisor, a test or a human knows when it is up.
- SIGINT / SIGTERM stop it cleanly: it claims nothing more, lets the events in flight
  finish and commit, closes the store and the transport and exits 0. A second signal stops
  it at once; events still in flight then come back to another worker when their lease
  (`--visibility`) runs out, and the store's dedupe makes the redelivery harmless.
- On this package's transport an idle worker does not poll: its claim waits for a change
  stream's wake-up, the end of a lease or park, or the store's next timer (`--idle-wait`
  caps the wait; `harel_beanie.transport.wakeups`). It refuses to start while messages wait
  in the other transport's collections, naming the command that moves them.
- Each event's relay is kept to its own execution, and a sweep every `--sweep-every`
  seconds (and once at start) relays outbox entries and spawns that no handler relayed —
  a worker that died between commit and relay, a relay that lost a race. See
  `harel_beanie.deploy.relay` for why harel's relay alone leaves work behind.
- On this package's transport the worker leases a share of the database's partitions
  (`harel_beanie.transport.ownership`): its claims, timer sweeps and relay sweeps read only
  those, so N workers divide the background work instead of each doing all of it; a
  worker that dies has its partitions taken over within `TAKEOVER_BOUND` seconds, and one
  that stops gives them back at once. On harel's transport every worker sweeps everything.
- `--history FILE` records every create, commit and read its store makes (invoke, then ok,
  fail or unknown), and every publish and delivery of its transport, for `harel-beanie
  check-history` (`harel_beanie.history`): how a staging run under faults is checked for
  lost, doubled and reordered work.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from harel_beanie.commands import flags
from harel_beanie.core.errors import ConfigError
from harel_beanie.core.limits import MAX_VISIBILITY

if TYPE_CHECKING:
    from harel_beanie.core.partitions import PartitionScope
    from harel_beanie.deploy.where import Target
    from harel_beanie.transport.ownership import PartitionOwner

NAME = "worker"
HELP = "a long-running harel AsyncWorker on the store"
DESCRIPTION = (
    "Claim and process the events queued on this package's transport (--transport harel: harel's Mongo "
    "transport), with the store on the same server, until SIGINT or SIGTERM (in-flight events finish first). "
    "Flags override harel's HAREL_* variables."
)
#: a worker serves a deployment's database: never the embedded server
WHERE = "url"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--definitions", metavar="DIR", help="directory of *.stm machines (default: $HAREL_DEFINITIONS_DIR)")
    p.add_argument(
        "--concurrency", type=flags.positive_int, help="events in flight (default: $HAREL_CONCURRENCY, else 256)"
    )
    p.add_argument("--worker-id", help="this worker's id (default: $HAREL_WORKER_ID, else host-pid)")
    p.add_argument(
        "--visibility",
        type=flags.seconds(MAX_VISIBILITY),
        metavar="SECONDS",
        help=f"lease of an event in flight (default: $HAREL_VISIBILITY, else 30; at most {MAX_VISIBILITY:g})",
    )
    p.add_argument(
        "--trace",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="record execution timelines (default: $HAREL_TRACE, else off)",
    )
    p.add_argument(
        "--sweep-every",
        type=flags.positive_float,
        default=5.0,
        metavar="SECONDS",
        help="relay outbox entries and spawns no handler relayed, this often (default 5)",
    )
    p.add_argument(
        "--history",
        metavar="FILE",
        help="append every create, commit and read of the store to FILE (JSON lines) for `harel-beanie check-history`",
    )
    flags.transport(p)


log = logging.getLogger("harel_beanie.commands.worker")

#: which transport a worker runs on when `--transport` is not given (`beanie` or `harel`)
TRANSPORT_ENV = "HAREL_BEANIE_TRANSPORT"
#: the transport a worker runs on unless told (`harel_beanie.deploy.stack.TRANSPORTS[0]`: a
#: test holds them equal; imported from there, `--help` would load the whole stack)
DEFAULT_TRANSPORT = "beanie"


def load_definitions(directory: str) -> dict[str, Any]:
    """Every machine in `directory`/*.stm, validated, its actions imported; a `ConfigError`
    naming the problem otherwise."""
    from harel_beanie.deploy.loader import load_models

    path = Path(directory)
    if not path.is_dir():
        raise ConfigError(f"no definitions directory at {directory}")
    try:
        definitions = load_models(path)
    except Exception as exc:  # a parse, validation or import error in the user's models
        raise ConfigError(f"cannot load the definitions in {directory}: {type(exc).__name__}: {exc}") from None
    if not definitions:
        raise ConfigError(f"no machines in {directory} (expected *.stm files)")
    return definitions


def settings(args: Any) -> dict[str, Any]:
    """The worker's settings: flags first, then harel's `HAREL_*` variables, then harel's defaults."""
    from harel.config import Config

    try:
        cfg = Config.from_env()
    except ValueError as exc:
        raise ConfigError(f"a HAREL_* variable is not a number: {exc}") from None
    directory = args.definitions or cfg.definitions_dir
    if not directory:
        raise ConfigError("no definitions: pass --definitions DIR or set HAREL_DEFINITIONS_DIR")
    return {
        "definitions_dir": directory,
        "concurrency": args.concurrency or cfg.concurrency,
        "worker_id": args.worker_id or cfg.worker_id or f"{socket.gethostname()}-{os.getpid()}",
        "visibility": args.visibility or cfg.visibility,
        "trace": cfg.trace if args.trace is None else args.trace,
        "trace_max": cfg.trace_max,
        "create_schema": cfg.create_schema,
        "sweep_every": args.sweep_every,
        "transport": args.transport or os.environ.get(TRANSPORT_ENV) or DEFAULT_TRANSPORT,
        "idle_wait": args.idle_wait,
        "history": args.history,
        # the one clock the worker's leases, claims, timers and sweeps read (no flag: the seam
        # a test replaces to run a worker whose clock is skewed, see docs/production-stack.md)
        "clock": time.time,
    }


def check_flags(args: Any) -> None:
    """The settings and the definitions' folder, refused before any server is reached (the
    machines are loaded once, by `main`)."""
    opts = settings(args)
    if opts["concurrency"] < 1:
        raise ConfigError(f"concurrency must be at least 1, got {opts['concurrency']}")
    if not Path(opts["definitions_dir"]).is_dir():
        raise ConfigError(f"no definitions directory at {opts['definitions_dir']}")


def main(args: Any, target: Target) -> int:
    import asyncio

    opts = settings(args)
    if opts["concurrency"] < 1:
        raise ConfigError(f"concurrency must be at least 1, got {opts['concurrency']}")
    definitions = load_definitions(opts["definitions_dir"])
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(serve(target, definitions, opts))


async def serve(target: Target, definitions: dict[str, Any], opts: dict[str, Any]) -> int:
    """The worker's life: the store and transport opened, its share of the partitions taken,
    the work earlier workers left relayed, harel's loop run until a signal, the share given
    back. Kept whole: the store, the transport and the partition owner share one scope, and
    are closed together."""
    from harel.engine.schema import Names

    from harel_beanie.core.partitions import PartitionScope
    from harel_beanie.deploy.serving import first_look
    from harel_beanie.deploy.stack import TRANSPORTS, CountingWorker, open_client
    from harel_beanie.history.recording import RecordingStore, RecordingTransport
    from harel_beanie.history.records import HistoryWriter
    from harel_beanie.store.async_store import AsyncMongoStore
    from harel_beanie.transport.ownership import PartitionOwner

    client = await open_client(target)
    # with this package's transport, the store, the transport and the partition owner share
    # one scope: the leases the owner holds are what the sweeps and claims read
    clock = opts.get("clock") or time.time
    scope = PartitionScope(held={}, clock=clock) if opts["transport"] == TRANSPORTS[0] else None
    store: Any = AsyncMongoStore(
        client,
        target.db,
        prefix=target.prefix,
        create_schema=opts["create_schema"],
        trace_max=opts["trace_max"],
        partitions=scope,
    )
    history = HistoryWriter(opts["history"], opts["worker_id"]) if opts["history"] else None
    if history is not None:
        store = RecordingStore(store, history)
    transport = None
    owner: Optional[PartitionOwner] = None
    try:
        transport = await _start(store, client, target, opts, scope)
        if scope is not None:
            owner = PartitionOwner(transport.partition_leases, opts["worker_id"], scope, clock=clock)
            await first_look(owner)
        if history is not None:
            transport = RecordingTransport(transport, history)
        executions = client[target.db][Names(target.prefix).executions]
        worker = CountingWorker(
            store,
            transport,
            definitions,
            worker_id=opts["worker_id"],
            visibility=opts["visibility"],
            concurrency=opts["concurrency"],
            trace=opts["trace"],
            executions=executions,
            clock=clock,
        )
        await _relay_leftovers(store, transport, executions, worker, opts)
        await _until_stopped(target, definitions, opts, store, transport, executions, worker, owner)
        return 0
    finally:
        await store.close()
        if transport is not None:
            await transport.close()


async def _relay_leftovers(store: Any, transport: Any, executions: Any, worker: Any, opts: dict[str, Any]) -> None:
    """The pending work earlier workers left, relayed before this one starts claiming."""
    from pymongo.errors import ConnectionFailure

    from harel_beanie.deploy.relay import sweep

    try:
        leftover = await sweep(store, transport, executions, worker.definitions, worker.clock, trace=opts["trace"])
    except ConnectionFailure:  # the periodic sweep will do it once the server answers again
        leftover = 0
    if leftover:
        print(
            f"worker {opts['worker_id']}: relayed the pending work of {leftover} execution(s) left by earlier workers",
            flush=True,
        )


async def _until_stopped(
    target: Target,
    definitions: dict[str, Any],
    opts: dict[str, Any],
    store: Any,
    transport: Any,
    executions: Any,
    worker: Any,
    owner: Optional[PartitionOwner],
) -> None:
    """harel's loop, the sweeps and the leases run until SIGTERM or SIGINT: the first lets
    the events in flight finish, a second stops at once (they come back after their lease).
    Kept whole: the signal handler, the tasks and their clean-up share the stop event and the signal count."""
    import asyncio

    from harel_beanie.core.documents import bind
    from harel_beanie.deploy.serving import give_back, run_through_outages, sweep_forever
    from harel_beanie.queries.samples import sample_if_due, samples_name

    wid = opts["worker_id"]
    stop = asyncio.Event()
    run = asyncio.create_task(run_through_outages(worker, stop, wid))
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            name = signal.Signals(signum).name
            print(f"worker {wid} stopping ({name}): finishing {worker.in_flight} event(s) in flight", flush=True)
            stop.set()
            getattr(transport, "wake", lambda: None)()  # a claim waiting for work returns now
        else:
            lease = opts["visibility"]
            print(
                f"worker {wid}: second signal, stopping now; events in flight come back after their {lease:g}s lease",
                flush=True,
            )
            run.cancel()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    samples = executions.database[samples_name(target.prefix)]
    doc = bind(target.prefix)[0]
    sweeper = asyncio.create_task(
        sweep_forever(
            store,
            transport,
            executions,
            worker,
            opts["sweep_every"],
            stop,
            opts["trace"],
            sample=lambda: sample_if_due(doc, samples),
        )
    )
    leases = asyncio.create_task(owner.run(stop)) if owner is not None else None
    print(_ready_line(target, definitions, opts, transport, owner), flush=True)
    try:
        await run
    except asyncio.CancelledError:
        if signals < 2:
            raise
    finally:
        sweeper.cancel()
        if leases is not None:
            leases.cancel()
        await asyncio.gather(sweeper, *([leases] if leases else []), return_exceptions=True)
        if owner is not None and signals < 2:
            await give_back(owner, wid)
    print(f"worker {wid} stopped: {worker.handled} events handled", flush=True)


def _ready_line(
    target: Target, definitions: dict[str, Any], opts: dict[str, Any], transport: Any, owner: Optional[PartitionOwner]
) -> str:
    from harel_beanie.deploy.serving import share

    top = sorted(d for d in definitions if "." not in d)  # the rest are their invoked submachines
    return (
        f"worker {opts['worker_id']} ready: {target.masked_url} database {target.db} prefix {target.prefix}; "
        f"{len(top)} machines from {opts['definitions_dir']} ({', '.join(top)}); "
        f"concurrency {opts['concurrency']}, visibility {opts['visibility']:g}s, "
        f"transport {opts['transport']}{_wake_mode(transport)}, "
        f"trace {'on' if opts['trace'] else 'off'}{share(owner)}"
    )


async def _start(
    store: Any, client: Any, target: Target, opts: dict[str, Any], scope: Optional[PartitionScope] = None
) -> Any:
    """The store's set-up, the stranded-messages check and the transport, tried again (per
    `--connect-attempts`) when the connection breaks meanwhile: the first ping answering is
    no promise that the next command will, and a worker that exits on a blip during its
    start-up is one a supervisor must restart for nothing."""
    import asyncio

    from pymongo.errors import ConnectionFailure

    from harel_beanie.deploy.stack import open_transport, refuse_if_stranded
    from harel_beanie.transport.prefetch import PREFETCH_CAP

    failure: Optional[ConnectionFailure] = None
    for pause in target.retry.pauses():
        if failure is not None:
            print(
                f"worker {opts['worker_id']}: lost the server while starting ({type(failure).__name__}); "
                f"retrying in {pause:g}s",
                flush=True,
            )
            await asyncio.sleep(pause)
        try:
            await store.init()
            await refuse_if_stranded(client[target.db], target.prefix, opts["transport"])
            return await open_transport(
                target,
                kind=opts["transport"],
                create_schema=opts["create_schema"],
                idle_wait=opts["idle_wait"],
                timers=store.next_timer,
                partitions=scope,
                clock=opts.get("clock") or time.time,
                prefetch=min(opts["concurrency"], PREFETCH_CAP),
            )
        except ConnectionFailure as exc:
            failure = exc
    assert failure is not None
    raise failure


def _wake_mode(transport: Any) -> str:
    """How an idle claim of this transport wakes, as the ready line says it."""
    wakeups = getattr(transport, "wakeups", None)
    return (
        ""
        if wakeups is None
        else f" (idle claims wait up to {transport.settings.idle_wait:g}s, woken by a change stream where the server has one)"
    )
