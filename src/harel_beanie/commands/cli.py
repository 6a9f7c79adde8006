"""The `harel-beanie` command line (also `python -m harel_beanie`).

Why this module exists: one entry point for running statechart workloads on the store
(`demo`, `worker`), serving the embedded server to your own code (`server`), watching them (`status`, `monitor`, `dashboard`), removing finished ones
(`prune`), evolving the schema (`migrate`, `migrate-transport`), sharding it on a cluster
(`shard`) and judging a fault run's recorded history (`check-history`, the one command that
needs no database). This module only lists the commands: each lives in its own module of
this package, named as the command, with its flags beside its `main`. What it adds is the
one way every command is started — one set of `--url`/`--db`/`--prefix` rules
(`harel_beanie.deploy.where`) — and the errors a user can cause — a wrong flag, an
unreachable server, a missing directory, a database in another layout or sharded against
the plan — turned into one line on stderr and exit code 2 (a command that refuses or fails
on its own terms raises `CommandFailed`: one line, its exit code).

Each command module imports at its top only what its flags need (argparse, `flags`, the
driver-free errors), and what it runs on inside its `main`: building the parser and refusing
a flag then load no driver, no Beanie and no harel engine, so `--help`, `--version` and a
typo answer at once and each command pays only for its own imports.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from types import ModuleType
from typing import Any, Callable, NoReturn, Optional, Sequence

from harel_beanie.commands import (
    check_history,
    dashboard,
    demo,
    flags,
    migrate,
    migrate_transport,
    monitor,
    prune,
    server,
    shard,
    status,
    worker,
)
from harel_beanie.core.arguments import BadArgument, BadArgumentType
from harel_beanie.core.errors import (
    CommandFailed,
    ConfigError,
    SchemaMismatch,
    ShardPlanError,
    StoreUnavailable,
)

PROG = "harel-beanie"

#: Every command, in the order `--help` lists them. Each module holds `NAME`, `HELP`,
#: `DESCRIPTION`, `WHERE` ("embedded": a URL, else the embedded server; "url": a URL only;
#: "offline": local files only), `add_arguments(parser)` and `main`, and may hold
#: `check_flags(args)`: what its flags can be refused for, run before any server is started or
#: reached, so a typo costs no wait, and `MAKES_DATA` (True: with no URL, it may start the
#: embedded server on a data folder that does not exist yet; the others only read one).
COMMANDS: tuple[ModuleType, ...] = (
    demo,
    server,
    worker,
    status,
    monitor,
    dashboard,
    prune,
    migrate,
    migrate_transport,
    shard,
    check_history,
)


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (raised, printed by `main`), and a flag is
    taken only as spelled: with argparse's abbreviations `--model` would be read as
    `--models`, and a destructive command would run on a flag the user never typed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Run harel statecharts on MongoDB with harel-beanie's store, watch them, query them.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for command in COMMANDS:
        p = sub.add_parser(command.NAME, help=command.HELP, description=command.DESCRIPTION)
        if command.WHERE != "offline":
            flags.connection(p, embedded=command.WHERE == "embedded")
        command.add_arguments(p)
        p.set_defaults(handler=_handler(command))
    return parser


def _version() -> str:
    """This package's version, and harel's beside it (the engine it runs)."""
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "unknown"

    return f"{of('harel-beanie')} (harel {of('harel')})"


def _handler(command: ModuleType) -> Callable[[Any], int]:
    """How `command` runs: an offline one on its arguments alone; any other on the target its
    flags resolve to (the embedded server only where it may use one; what is said about that
    goes to stdout for a command whose report it belongs to, else to stderr)."""
    check = getattr(command, "check_flags", lambda args: None)
    if command.WHERE == "offline":

        def offline(args: Any) -> int:
            check(args)
            return int(command.main(args))

        return offline
    notes = _stdout if getattr(command, "NOTES_ON_STDOUT", False) else _stderr

    def run(args: Any) -> int:
        check(args)
        # only now: the rules of where the data lives import the driver, which `--help`,
        # `--version` and a refused flag never need
        from harel_beanie.deploy.where import resolve

        with resolve(
            url=args.url,
            db=args.db,
            prefix=args.prefix,
            attempts=args.connect_attempts,
            timeout=args.connect_timeout,
            data=getattr(args, "data", None),
            embedded_ok=command.WHERE == "embedded",
            say=notes,
            command=args.command,
            makes_data=getattr(command, "MAKES_DATA", False),
        ) as target:
            return int(command.main(args, target))

    return run


def _stdout(line: str) -> None:
    print(line, flush=True)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


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
