"""`harel-beanie worker`: a long-running harel `AsyncWorker` on this store and a transport on
the same server (this package's own by default, harel's Mongo transport with
`--transport harel`) — what a deployment runs, N replicas of it.

Why this module exists: harel's own worker (`python -m harel.worker`) builds harel's
`AsyncMongoStore` for `HAREL_STORE_BACKEND=mongo`; it cannot be pointed at another store.
This is the same loop on ours (`harel_beanie.Worker`, which an app runs in its own process
the same way), configured as harel's is: the `HAREL_*` variables harel's
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
- `--retain AGE` (`30d`) removes, about once a minute, the executions that finished longer
  ago than that, in the partitions this worker leases, through prune's flow (into
  `--archive FILE` or `--archive-collection NAME` when given): the counts stay exact and each
  removal is archived once, however many workers retain and whoever prunes by hand
  (`harel_beanie.retention.schedule`). It replaces the retired TTL index, which it drops.
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
from typing import TYPE_CHECKING, Any

from harel_beanie.commands import flags
from harel_beanie.core.errors import ConfigError
from harel_beanie.core.limits import MAX_VISIBILITY

#: a worker's retention period, on average, and the longest it takes (seconds); as
#: `harel_beanie.retention.schedule` has them (a test holds them equal: imported from
#: there, `--help` would load the retention package)
RETAIN_EVERY = 60.0
MAX_RETAIN_EVERY = 86400.0

if TYPE_CHECKING:
    from harel_beanie.deploy.where import Target
    from harel_beanie.deploy.worker import Worker

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
    p.add_argument(
        "--retain",
        metavar="AGE",
        help="remove executions that finished longer ago than AGE (an age with its unit: 30d, 12h), about once a "
        "minute, in this worker's partitions, as prune does (default: keep them)",
    )
    p.add_argument(
        "--retain-every",
        type=flags.seconds(MAX_RETAIN_EVERY),
        default=None,
        metavar="SECONDS",
        help=f"how often --retain runs, on average (default {RETAIN_EVERY:g}, jittered; at most {MAX_RETAIN_EVERY:g})",
    )
    p.add_argument("--archive", metavar="FILE.jsonl", help="with --retain: append each removed execution to this file")
    p.add_argument(
        "--archive-collection", metavar="NAME", help="with --retain: copy each removed execution into this collection"
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
        "retain": args.retain,
        "retain_every": args.retain_every or RETAIN_EVERY,
        "archive": args.archive,
        "archive_collection": args.archive_collection,
        # the one clock the worker's leases, claims, timers and sweeps read (no flag: the seam
        # a test replaces to run a worker whose clock is skewed, see docs/production-stack.md)
        "clock": time.time,
    }


def check_flags(args: Any) -> None:
    """The settings and the definitions' folder, refused before any server is reached (the
    machines are loaded once, by `main`)."""
    check_retention(args)
    opts = settings(args)
    if opts["concurrency"] < 1:
        raise ConfigError(f"concurrency must be at least 1, got {opts['concurrency']}")
    if not Path(opts["definitions_dir"]).is_dir():
        raise ConfigError(f"no definitions directory at {opts['definitions_dir']}")


def check_retention(args: Any) -> None:
    """`--retain` an age with its unit; the archive flags only beside it, and one of them."""
    from harel_beanie.core.ages import parse_age

    if args.retain is not None:
        flags.value_of("--retain", parse_age, args.retain)
    elif args.archive or args.archive_collection or args.retain_every is not None:
        given = "--archive" if args.archive else "--archive-collection" if args.archive_collection else "--retain-every"
        raise ConfigError(f"{given} is for retention: give --retain AGE too (e.g. --retain 30d)")
    if args.archive and args.archive_collection:
        raise ConfigError("--archive and --archive-collection: choose one")


def main(args: Any, target: Target) -> int:
    import asyncio

    opts = settings(args)
    if opts["concurrency"] < 1:
        raise ConfigError(f"concurrency must be at least 1, got {opts['concurrency']}")
    check_retention(args)
    definitions = load_definitions(opts["definitions_dir"])
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(serve(target, definitions, opts))


async def serve(target: Target, definitions: dict[str, Any], opts: dict[str, Any]) -> int:
    """The worker's life, as an app's own process runs it (`harel_beanie.Worker`): here with
    its ready line, the stop lines, the signals and `--history`. SIGTERM or SIGINT lets the
    events in flight finish; a second stops at once (they come back after their lease).
    Kept whole: the signal handler, the worker's task and its lines share the stop event and
    the signal count."""
    import asyncio

    from harel_beanie.deploy.worker import Worker
    from harel_beanie.history.recording import RecordingStore, RecordingTransport
    from harel_beanie.history.records import HistoryWriter
    from harel_beanie.retention.archive import JsonlArchive

    history = HistoryWriter(opts["history"], opts["worker_id"]) if opts["history"] else None
    wid = opts["worker_id"]
    worker = Worker(
        target.url,
        definitions,
        db_name=target.db,
        prefix=target.prefix,
        retry=target.retry,
        concurrency=opts["concurrency"],
        worker_id=wid,
        visibility=opts["visibility"],
        trace=opts["trace"],
        trace_max=opts["trace_max"],
        create_schema=opts["create_schema"],
        transport_kind=opts["transport"],
        idle_wait=opts["idle_wait"],
        sweep_every=opts["sweep_every"],
        clock=opts.get("clock") or time.time,
        wrap_store=None if history is None else lambda store: RecordingStore(store, history),
        wrap_transport=None if history is None else lambda transport: RecordingTransport(transport, history),
        on_ready=lambda w: print(_ready_line(target, definitions, opts, w), flush=True),
        say=lambda line: print(line, flush=True),
        retain=opts.get("retain"),
        retain_every=opts.get("retain_every") or RETAIN_EVERY,
        archive=JsonlArchive(opts["archive"]) if opts.get("archive") else None,
        archive_collection=opts.get("archive_collection"),
    )
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            name = signal.Signals(signum).name
            print(f"worker {wid} stopping ({name}): finishing {worker.in_flight} event(s) in flight", flush=True)
            stop.set()  # the worker wakes a claim waiting for work itself
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
    try:
        await run
    except asyncio.CancelledError:
        if signals < 2:
            raise
    print(f"worker {wid} stopped: {worker.handled} events handled", flush=True)
    return 0


def _ready_line(target: Target, definitions: dict[str, Any], opts: dict[str, Any], worker: Worker) -> str:
    top = sorted(d for d in definitions if "." not in d)  # the rest are their invoked submachines
    return (
        f"worker {opts['worker_id']} ready: {target.masked_url} database {target.db} prefix {target.prefix}; "
        f"{len(top)} machines from {opts['definitions_dir']} ({', '.join(top)}); {worker.describe()}"
    )
