"""`harel-beanie server`: the embedded server in the foreground, for your own code.

Why this module exists: every other command starts the embedded server for as long as it
runs and stops it after, so a user's own worker, a migration or a snippet of the manual had
no server to point at without installing MongoDB. This one starts it on the data folder
(`harel_beanie.deploy.local_server`, the folder the other commands use), prints the
`MONGODB_URL` to export, and keeps it until Ctrl-C or SIGTERM. Commands run meanwhile in the
same folder join it through its handoff file; a second `server` on the folder is refused
(a lock held while it runs, and the handoff file of a server another command runs there).
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import time
from pathlib import Path
from typing import IO, Any

from harel_beanie.commands import flags
from harel_beanie.core.errors import ConfigError

#: the data folder's name, as `harel_beanie.deploy.where` has it (a test holds them equal):
#: imported from there, `--help` would load the deploy package
DEFAULT_DATA_DIR = "harel-beanie-data"

NAME = "server"
HELP = "the embedded MongoDB server in the foreground: prints the MONGODB_URL to export"
DESCRIPTION = (
    "Start the embedded MongoDB server (SecantusDB) on the data folder and keep it until Ctrl-C or SIGTERM, "
    "printing the MONGODB_URL to export for your own code, a worker or a migration. Commands run in the same "
    "folder meanwhile use it. Needs the server extra."
)
#: it takes no URL: it is the server
WHERE = "offline"
#: the port it listens on unless --port says otherwise: fixed, so the line the manual prints
#: is the line it prints (not 27017, where a local mongod listens)
DEFAULT_PORT = 27018


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        metavar="DIR",
        help=f"the folder its data is kept in (default: $HAREL_BEANIE_DATA, else ./{DEFAULT_DATA_DIR})",
    )
    p.add_argument(
        "--port",
        type=flags.port,
        default=DEFAULT_PORT,
        help=f"the port it listens on, on 127.0.0.1 (default {DEFAULT_PORT})",
    )


def folder(args: Any) -> Path:
    return Path(args.data or os.environ.get("HAREL_BEANIE_DATA") or DEFAULT_DATA_DIR)


def check_flags(args: Any) -> None:
    """A server already on the folder, then the port, refused before anything is made (a
    folder, a lock)."""
    from harel_beanie.deploy.local_server import LocalServer

    data = folder(args)
    found = LocalServer(data, NAME).running()
    if found is not None:
        raise ConfigError(_already(data, found))
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", args.port))
        except OSError as exc:
            taken = exc.errno == errno.EADDRINUSE
            raise ConfigError(
                f"--port {args.port} "
                + ("is in use on 127.0.0.1: pass --port N" if taken else f"cannot be used: {exc}")
            ) from None


def main(args: Any) -> int:
    from harel_beanie.deploy.local_server import LocalServer

    data = folder(args)
    local = LocalServer(data, NAME, port=args.port)
    data.mkdir(parents=True, exist_ok=True)
    lock = _lock(data)
    try:
        local.open()
        if local.mode != "started":  # another server came up between the look and the lock
            raise ConfigError(_already(data, local.running() or {}))
        _announce(local.url, data)
        try:
            while local._server is not None and local._server.proc is not None and local._server.proc.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (the CLI turns it into this)
            print(f"Stopping the embedded server (its data stays in {data}/).", flush=True)
            return 0
        code = local._server.proc.returncode if local._server and local._server.proc else None
        raise ConfigError(f"the embedded server exited on its own (code {code}); see {data}/server.log")
    finally:
        local.close()
        lock.close()


def _already(data: Path, found: dict[str, Any]) -> str:
    port, who = found.get("port"), found.get("command") or "harel-beanie"
    where = f"export MONGODB_URL=mongodb://127.0.0.1:{port}" if port else "see its server.json"
    return (
        f"an embedded server already runs on {data}/ (pid {found.get('pid', '?')}, started by `harel-beanie {who}`): "
        f"use it ({where}), or pass --data DIR for another folder"
    )


def _lock(data: Path) -> IO[str]:
    """The folder's lock, held until closed; refused if another `server` holds it."""
    import fcntl

    from harel_beanie.deploy.local_server import LOCK_FILE

    handle = open(data / LOCK_FILE, "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise ConfigError(
            f"another `harel-beanie server` is starting on {data}/: use it, or pass --data DIR for another folder"
        ) from None
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def _announce(url: str, data: Path) -> None:
    from harel_beanie.deploy.where import URL_ENV

    print(f"harel-beanie server: the embedded MongoDB server (SecantusDB) on {url}, data in {data}/", flush=True)
    print("Point your code, a worker or a migration at it (in another terminal):", flush=True)
    print(f"  export MONGODB_URL={url}", flush=True)
    set_elsewhere = [v for v in URL_ENV if os.environ.get(v) and os.environ[v] != url]
    if set_elsewhere:
        print(
            f"  (here {set_elsewhere[0]} names another server: commands use that one until you export the line above)"
        )
    print("harel-beanie commands run in this folder use it too. Ctrl-C (or SIGTERM) stops it.", flush=True)
