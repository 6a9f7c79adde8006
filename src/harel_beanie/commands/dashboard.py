"""`harel-beanie dashboard`: the web dashboard served standalone by uvicorn, guarded by a token
(the app it serves is `harel_beanie.dashboard.serve`'s; it needs the `dashboard` extra).

It prints a link only to a page that will answer: the port is bound first and held for
uvicorn, then the server is pinged with the command line's short policy and the database
checked for a mistyped name (`harel_beanie.deploy.where`), each refusal one line, exit 2, as
every other command's.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harel_beanie.commands import flags
from harel_beanie.core.errors import ConfigError

if TYPE_CHECKING:
    from harel_beanie.deploy.where import Target

NAME = "dashboard"
HELP = "the web dashboard, served standalone (uvicorn)"
DESCRIPTION = (
    "Serve the web dashboard (executions, one execution's timeline, failed and silent ones, backlog, /metrics) on "
    "this machine, guarded by a token. Needs the dashboard extra: pip install 'harel-beanie[dashboard]'."
)
WHERE = "embedded"
#: what it says about the embedded server sits with its address, on stdout
NOTES_ON_STDOUT = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=flags.port, default=8000, help="port (default 8000)")
    p.add_argument(
        "--token",
        help="the token a browser or script must present (default: $HAREL_DASHBOARD_TOKEN, else the one kept in the "
        "data folder, drawn at the first start; printed)",
    )
    p.add_argument(
        "--new-token",
        action="store_true",
        help="draw a new token and keep it in the data folder: every link and cookie given before stops working",
    )
    p.add_argument(
        "--allow",
        metavar="ACTIONS",
        help="turn on actions, comma-separated, of send,cancel,redrive,terminate,suspend,resume (default none; "
        "needs --definitions)",
    )
    p.add_argument(
        "--definitions",
        metavar="DIR",
        help="*.stm directory: the statecharts drawn (default: the shop models shipped in the package) and the "
        "machines the actions run",
    )
    flags.stuck_after(p, "silent")


def check_flags(args: Any) -> None:
    """The extra, `--allow` and `--definitions`, refused before any server starts."""
    _web()
    from harel_beanie.dashboard.serve import parse_allow

    if args.new_token and (args.token or os.environ.get("HAREL_DASHBOARD_TOKEN")):
        raise ConfigError(
            "--new-token draws the token kept in the data folder: leave out --token and $HAREL_DASHBOARD_TOKEN"
        )
    if parse_allow(args.allow) and not args.definitions:
        raise ConfigError("--allow needs --definitions DIR: harel's runner needs the machines to act on executions")
    if args.definitions and not Path(args.definitions).is_dir():
        raise ConfigError(f"--definitions: no definitions directory at {args.definitions}")


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port`, for uvicorn to serve on; a `ConfigError` naming the
    flag when the port is taken or the address cannot be bound."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host}: cannot be resolved ({exc.strerror})") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    # as uvicorn binds: a port left in TIME_WAIT by an earlier dashboard is reused, one another
    # process listens on is still refused
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"--port {port} is in use on {host}: pass --port N") from None
        raise ConfigError(f"--host {host} --port {port}: cannot listen there: {exc.strerror or exc}") from None
    return sock


async def _check_server(target: Target) -> None:
    """The server answers (the command line's short policy: `StoreUnavailable`, one line) and
    the database is not a mistyped name (`ConfigError` saying which one was meant)."""
    from harel_beanie.deploy.stack import open_client
    from harel_beanie.deploy.where import mistyped_db

    client = await open_client(target)
    try:
        hint = await mistyped_db(client, target.db, target.prefix)
    finally:
        await client.close()
    if hint is not None:
        raise ConfigError(hint)


def _web() -> Any:
    """uvicorn, or one line saying how to get the web stack (an extra)."""
    try:
        import uvicorn

        import harel_beanie.dashboard.serve  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"the dashboard needs its extra: pip install 'harel-beanie[dashboard]' ({exc})") from None
    return uvicorn


def main(args: Any, target: Target) -> int:
    import asyncio

    uvicorn = _web()
    from harel_beanie.dashboard.serve import build_app, parse_allow

    sock = listen(args.host, args.port)
    try:
        asyncio.run(_check_server(target))
        return _serve(uvicorn, build_app, parse_allow, args, target, sock)
    finally:
        sock.close()


def _serve(uvicorn: Any, build_app: Any, parse_allow: Any, args: Any, target: Target, sock: socket.socket) -> int:
    """The app built, its link printed, and uvicorn serving it on `sock` until Ctrl-C."""
    from harel_beanie.dashboard.tokens import kept_token

    say = print
    token = args.token or os.environ.get("HAREL_DASHBOARD_TOKEN") or kept_token(target.data_dir, rotate=args.new_token)
    app = build_app(
        target,
        token=token,
        allow=parse_allow(args.allow),
        definitions_dir=args.definitions,
        stuck_after=args.stuck_after,
        say=say,
    )
    host = args.host
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    given = args.token or os.environ.get("HAREL_DASHBOARD_TOKEN")
    say(f"harel-beanie dashboard on {target.masked_url}, database {target.db}, prefix {target.prefix}")
    say(f"  open http://{shown}:{args.port}/?token={'<your token>' if given else token}")
    say(f"  metrics at http://{shown}:{args.port}/metrics (Authorization: Bearer <token>); Ctrl-C stops")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    server.run(sockets=[sock])
    return 0
