"""The `harel-beanie` command line (also `python -m harel_beanie`).

Why this module exists: one entry point for running statechart workloads on the store
(`demo`, `worker`), watching them (`status`, `monitor`, `dashboard`), removing finished ones
(`prune`), evolving the schema (`migrate`), sharding it on a cluster (`shard`) and judging
a fault run's recorded history (`check-history`, the one command that needs no database).
This module only parses flags — one parser, and one set of `--url`/`--db`/`--prefix` rules
(`harel_beanie.deploy.where`) for every command — and turns the errors a user can cause — a
wrong flag, an unreachable server, a missing directory, a database in another layout or
sharded against the plan — into one line on stderr and exit code 2 (a command that refuses
or fails on its own terms raises `CommandFailed`: one line, its exit code). Each command
lives in its own module, imported only when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from typing import Any, Callable, NoReturn, Optional, Sequence

from harel_beanie.core.arguments import parse_number, require_int, require_seconds
from harel_beanie.core.errors import CommandFailed, ConfigError
from harel_beanie.transport.settings import MAX_IDLE_WAIT, MAX_VISIBILITY

PROG = "harel-beanie"


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (raised, printed by `main`)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def _flag(check: Callable[[str, str], Any]) -> Callable[[str], Any]:
    """An argparse `type` from a check of `harel_beanie.core.arguments` (the one rule every
    door follows): argparse names the flag in its one-line error."""

    def parse(text: str) -> Any:
        try:
            return check("value", text)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("value ")) from None

    return parse


def _whole(what: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what} expected a whole number, got {text!r}") from None
    return require_int(what, value, low=1, high=2**31 - 1)


def _seconds(high: float) -> Callable[[str], float]:
    """A flag of seconds above 0 and at most `high`: every wait, lease and threshold a flag
    sets is bounded, so a typo of a few digits is refused rather than obeyed for ages."""
    return _flag(lambda what, text: require_seconds(what, parse_number(what, text), positive=True, high=high))


_positive_int = _flag(_whole)
_DAY = 86400.0
_positive_float = _seconds(_DAY)
_PING = _seconds(60.0)  # a ping's wait, as RetryPolicy bounds it


def _connection(p: argparse.ArgumentParser, embedded: bool) -> None:
    g = p.add_argument_group("where the data lives")
    g.add_argument("--url", help="MongoDB URL (default: $HAREL_MONGO_URL, then $MONGODB_URL"
                   + (", else the embedded server)" if embedded else ")"))  # fmt: skip
    g.add_argument("--db", help="database (default: $HAREL_MONGO_DB, else harel)")
    g.add_argument("--prefix", help="collection prefix (default: $HAREL_PREFIX, else harel)")
    if embedded:
        g.add_argument("--data", metavar="DIR",
                       help="the embedded server's folder when no URL is set (default: ./harel-beanie-data)")  # fmt: skip
    g.add_argument("--connect-attempts", type=_positive_int, metavar="N",
                   help="pings before giving up on the server (default 5, 0.5 s apart)")  # fmt: skip
    g.add_argument("--connect-timeout", type=_PING, metavar="SECONDS",
                   help="how long each ping waits for an answer (default 1)")  # fmt: skip


def _transport_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--transport", choices=("beanie", "harel"), default=None,
                   help="beanie: this package's transport (the default; $HAREL_BEANIE_TRANSPORT); harel: "
                   "harel's Mongo transport")  # fmt: skip
    p.add_argument("--idle-wait", type=_seconds(MAX_IDLE_WAIT), default=1.0, metavar="SECONDS",
                   help="the longest an idle claim waits for a wake-up on this package's transport (default 1, "
                   f"at most {MAX_IDLE_WAIT:g})")  # fmt: skip


def _stuck_after(p: argparse.ArgumentParser, called: str) -> None:
    p.add_argument("--stuck-after", type=_seconds(3650 * _DAY), default=300.0, metavar="SECONDS",
                   help=f"a RUNNING execution not updated for this long is {called} (default 300)")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Run harel statecharts on MongoDB with harel-beanie's store, watch them, query them.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    demo = sub.add_parser("demo", help="run the shop models shipped in the package through harel's engine on the store",
                          description="Run the shop's statechart workloads (orders, payments, pickers; shipped in the package) "
                          "through harel's AsyncWorker and Mongo transport on the store, then summarise. "
                          "With no URL, starts an embedded server whose data stays in ./harel-beanie-data.")  # fmt: skip
    demo.add_argument("-n", "--executions", type=_positive_int, default=300, metavar="N",
                      help="about how many executions to run (default 300)")  # fmt: skip
    demo.add_argument("--workers", type=_positive_int, default=2, help="AsyncWorker loops (default 2)")
    demo.add_argument("--concurrency", type=_positive_int, default=16,
                      help="events in flight per worker (default 16)")  # fmt: skip
    demo.add_argument(
        "--models",
        metavar="DIR",
        help="a directory of *.stm models to run instead (default: the shop models shipped in the package)",
    )
    demo.add_argument("--no-trace", action="store_true", help="do not record the execution timelines")
    demo.add_argument("--transport", choices=("beanie", "harel"), default=None,
                      help="beanie: this package's transport (the default; $HAREL_BEANIE_TRANSPORT); harel: harel's")  # fmt: skip
    _command(demo, "harel_beanie.demo.run", embedded=True, notes=_stdout)  # its notes belong to its report

    worker = sub.add_parser("worker", help="a long-running harel AsyncWorker on the store",
                            description="Claim and process the events queued on harel's Mongo transport, "
                            "with the store on the same server, until SIGINT or SIGTERM (in-flight events "
                            "finish first). Flags override harel's HAREL_* variables.")  # fmt: skip
    worker.add_argument(
        "--definitions", metavar="DIR", help="directory of *.stm machines (default: $HAREL_DEFINITIONS_DIR)"
    )
    worker.add_argument(
        "--concurrency", type=_positive_int, help="events in flight (default: $HAREL_CONCURRENCY, else 256)"
    )
    worker.add_argument("--worker-id", help="this worker's id (default: $HAREL_WORKER_ID, else host-pid)")
    worker.add_argument("--visibility", type=_seconds(MAX_VISIBILITY), metavar="SECONDS",
                        help="lease of an event in flight (default: $HAREL_VISIBILITY, else 30; "
                        f"at most {MAX_VISIBILITY:g})")  # fmt: skip
    worker.add_argument("--trace", action=argparse.BooleanOptionalAction, default=None,
                        help="record execution timelines (default: $HAREL_TRACE, else off)")  # fmt: skip
    worker.add_argument("--sweep-every", type=_positive_float, default=5.0, metavar="SECONDS",
                        help="relay outbox entries and spawns no handler relayed, this often (default 5)")  # fmt: skip
    worker.add_argument("--history", metavar="FILE",
                        help="append every create, commit and read of the store to FILE (JSON lines) for "
                             "`harel-beanie check-history`")  # fmt: skip
    _transport_flags(worker)
    _command(worker, "harel_beanie.ops.worker", embedded=False)

    status = sub.add_parser("status", help="backlog and health: counts, pending work, timers, stuck executions",
                            description="What is pending and what is stuck: executions by definition and "
                            "status, pending outbox and spawns, due and next timers, RUNNING executions "
                            "silent for longer than --stuck-after.")  # fmt: skip
    status.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of tables")
    _stuck_after(status, "stuck")
    status.add_argument("--show", type=_positive_int, default=10, metavar="N",
                        help="list at most N next timers and stuck executions (default 10)")  # fmt: skip
    _command(status, "harel_beanie.ops.status", embedded=True)

    monitor = sub.add_parser(
        "monitor",
        help="harel's monitoring TUI over the store",
        description="harel's monitoring TUI (list, detail, control plane) over the store.",
    )
    monitor.add_argument(
        "--definitions",
        metavar="DIR",
        help="*.stm directory for the statechart view (default: $HAREL_DEFINITIONS_DIR; none: data only)",
    )
    monitor.add_argument("--interval", type=_positive_float, default=None, metavar="SECONDS",
                         help="refresh interval (default: $HAREL_TUI_INTERVAL_MS, else 1 s)")  # fmt: skip
    monitor.add_argument("--theme", default=None, help="a Textual theme (default: $HAREL_TUI_THEME, else nord)")
    _command(monitor, "harel_beanie.ops.monitor", embedded=True)

    dash = sub.add_parser("dashboard", help="the web dashboard, served standalone (uvicorn)",
                          description="Serve the web dashboard (executions, one execution's timeline, failed and "
                          "silent ones, backlog, /metrics) on this machine, guarded by a token. Needs the "
                          "dashboard extra: pip install 'harel-beanie[dashboard]'.")  # fmt: skip
    dash.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    dash.add_argument("--port", type=_positive_int, default=8000, help="port (default 8000)")
    dash.add_argument("--token", help="the token a browser or script must present (default: $HAREL_DASHBOARD_TOKEN, "
                      "else a random one, printed)")  # fmt: skip
    dash.add_argument("--allow", metavar="ACTIONS", help="turn on actions, comma-separated: send,cancel,redrive "
                      "(default none; needs --definitions)")  # fmt: skip
    dash.add_argument("--definitions", metavar="DIR", help="*.stm directory: the statecharts drawn (default: "
                      "the shop models shipped in the package) and the machines the actions run")  # fmt: skip
    _stuck_after(dash, "silent")
    _command(dash, "harel_beanie.dashboard.serve", embedded=True, extra="dashboard", say=_stdout)

    prune = sub.add_parser("prune", help="remove (or archive) finished executions older than a cut-off",
                           description="Remove DONE/CANCELLED executions that finished before the cut-off, in "
                           "batches, each delete guarded on what was read; executions whose parent is still "
                           "going, or with events still to hand on, are kept. Re-running continues an "
                           "interrupted run. FAILED executions are never removed (redrive or terminate them).")  # fmt: skip
    prune.add_argument("--finished-before", metavar="AGE|DATE",
                       help="an age (30d, 12h, 90m), an ISO date/date-time (UTC unless given), or @epoch")  # fmt: skip
    prune.add_argument("--archive", metavar="FILE.jsonl", help="append each removed execution to this JSON Lines file")
    prune.add_argument("--archive-collection", metavar="NAME", help="copy each removed execution into this collection")
    prune.add_argument("--dry-run", action="store_true", help="count what would be removed; change nothing")
    prune.add_argument(
        "--batch-size", type=_positive_int, default=500, metavar="N", help="executions per batch (default 500)"
    )
    prune.add_argument("--ttl", metavar="AGE|off", help="instead: create or change the TTL index on finished_at "
                       "(the server expires finished executions by age alone), or drop it with 'off'")  # fmt: skip
    prune.add_argument("--json", action="store_true", help="print the report as JSON")
    _command(prune, "harel_beanie.ops.prune", embedded=True)

    migrate = sub.add_parser("migrate", help="move a database between layout versions (0: harel's MongoStore layout)",
                             description="Move a harel-beanie database between layout versions (0 is harel's own "
                             "MongoStore layout), in batches, resuming where an interrupted run stopped. Stop the "
                             "workers on the database first.")  # fmt: skip
    migrate.add_argument("action", choices=("up", "down", "status"), help="up: to this package's layout; "
                         "down: one version back (or --to); status: what the database holds")  # fmt: skip
    migrate.add_argument("--to", type=int, metavar="VERSION", help="target layout version (0 = harel's MongoStore)")
    migrate.add_argument("--batch-size", type=_positive_int, metavar="N", help="executions per batch (default 500)")
    # never the embedded server: a migration is for a deployment's database, and the
    # embedded one's data was written by this package, at its layout
    _command(migrate, "harel_beanie.migrate.command", embedded=False)
    # the flag's name before migrate shared the other commands' connection flags
    migrate.add_argument("--timeout", dest="connect_timeout", type=_PING, help=argparse.SUPPRESS)
    moving = sub.add_parser("migrate-transport", help="move undelivered messages between harel's Mongo transport "
                            "and this package's", description="With the workers and the publishers stopped, move "
                            "the messages waiting in harel's Mongo transport into this package's queues (up), or "
                            "back (down); status counts both. Running it again finishes a run cut short.")  # fmt: skip
    moving.add_argument("action", choices=("up", "down", "status"), help="up: into this package's transport; "
                        "down: back into harel's; status: what waits in each")  # fmt: skip
    _command(moving, "harel_beanie.ops.transport_move", embedded=False)

    shard = sub.add_parser("shard", help="shard the store's and transport's collections on a cluster, as planned",
                           description="Through a mongos: enable sharding on the database and shard the executions "
                           "({part: 1, _id: 1}), queues and overflow ({part: 1}) collections on the shard plan's keys, "
                           "creating their key indexes; every other collection stays on the primary shard. Refuses "
                           "when the server is not a mongos, the layout is not this package's, or a collection is "
                           "sharded on another key. Safe to run again.")  # fmt: skip
    _command(shard, "harel_beanie.ops.shard", embedded=False)

    checking = sub.add_parser("check-history", help="judge recorded history files: nothing lost, nothing doubled",
                              description="Read the history files a run's processes recorded (harel_beanie.history), "
                              "check that every acknowledged event was applied once and none twice, that each "
                              "execution's versions form one chain, that no read went back in time, that the final "
                              "states match harel's in-memory replay of the accepted events and that the work drained. "
                              "Prints the figures and each anomaly; exit 0 when there is none, 1 otherwise.")  # fmt: skip
    checking.add_argument("history", nargs="+", metavar="HISTORY", help="a JSON Lines history file (several: merged)")
    checking.add_argument("--definitions", metavar="DIR", required=True,
                          help="the *.stm directory the run used (for the replay)")  # fmt: skip
    checking.add_argument("--seen-field", default="seen", metavar="NAME",
                          help="the context field listing the ids of the events applied (default seen)")  # fmt: skip
    checking.add_argument("--json", action="store_true", help="print the verdict as JSON")
    _offline(checking, "harel_beanie.ops.history_check")
    return parser


# --- handlers -----------------------------------------------------------------------------


def _target(args: Any, *, embedded_ok: bool, say: Callable[[str], None]) -> Any:
    from harel_beanie.deploy.where import resolve

    return resolve(
        url=args.url,
        db=args.db,
        prefix=args.prefix,
        attempts=args.connect_attempts,
        timeout=args.connect_timeout,
        data=getattr(args, "data", None),
        embedded_ok=embedded_ok,
        say=say,
        command=args.command,
    )


def _stdout(line: str) -> None:
    print(line, flush=True)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _command(
    p: argparse.ArgumentParser,
    module: str,
    *,
    embedded: bool,
    notes: Callable[[str], None] = _stderr,
    extra: Optional[str] = None,
    **main_kwargs: Any,
) -> None:
    """The connection flags and the handler of one command: it resolves the target (the
    embedded server only when `embedded`; what it says about that goes to `notes`) and
    runs `main(args, target, **main_kwargs)` of `module`, imported only then; a module
    that needs the pip `extra` and cannot be imported is one line."""
    _connection(p, embedded=embedded)

    def handler(args: Any) -> int:
        try:
            runner = importlib.import_module(module)
        except ImportError as exc:  # the extra is not installed
            if extra is None:
                raise

            raise ConfigError(
                f"the {args.command} needs its extra: pip install 'harel-beanie[{extra}]' ({exc})"
            ) from None
        with _target(args, embedded_ok=embedded, say=notes) as target:
            return int(runner.main(args, target, **main_kwargs))

    p.set_defaults(handler=handler)


def _offline(p: argparse.ArgumentParser, module: str) -> None:
    """The handler of a command that works on local files only: no connection flags, no
    server; it runs `main(args)` of `module`, imported only then."""

    def handler(args: Any) -> int:
        return int(importlib.import_module(module).main(args))

    p.set_defaults(handler=handler)


# --- entry point --------------------------------------------------------------------------


def _interrupt(signum: int, frame: Any) -> None:
    # SIGTERM unwinds like Ctrl-C, so an embedded server this command started is stopped
    raise KeyboardInterrupt


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # name the command they were given to
            where = f"{PROG} {args.command}" if getattr(args, "command", None) else PROG
            raise UsageError(f"{where}: unrecognized arguments: {' '.join(extra)} (see `{where} --help`)")
    except UsageError as exc:
        _stderr(str(exc))
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    from harel_beanie.core.arguments import BadArgument, BadArgumentType
    from harel_beanie.core.errors import ConfigError, SchemaMismatch, ShardPlanError, StoreUnavailable

    where = f"{PROG} {args.command}"
    previous = None
    if args.command != "worker":  # the worker stops on SIGTERM its own way
        previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return int(args.handler(args))
    except (ConfigError, StoreUnavailable, SchemaMismatch, ShardPlanError, BadArgument, BadArgumentType) as exc:
        _stderr(f"{where}: {_one_line(exc)}")
        return 2
    except CommandFailed as exc:
        _stderr(f"{where}: {_one_line(exc)}")
        return exc.code
    except KeyboardInterrupt:
        _stderr(f"{where}: interrupted")
        return 130
    except Exception as exc:  # a bug or an outage mid-run: one line, the traceback on request
        if os.environ.get("HAREL_BEANIE_DEBUG"):
            raise
        _stderr(f"{where}: failed: {type(exc).__name__}: {_one_line(exc)} (HAREL_BEANIE_DEBUG=1 shows the traceback)")
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
