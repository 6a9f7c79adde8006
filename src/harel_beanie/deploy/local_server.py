"""The embedded server of a data folder, shared by the commands run on it meanwhile.

Why this module exists: with no URL, `demo`, `status`, `monitor` and `dashboard` use one
SecantusDB child process (`harel_beanie.deploy.embedded`) whose storage is a folder under the
working directory. A command that starts it leaves a small handoff file there, so a second
command run meanwhile joins the same server instead of starting another on the same files; a
server whose command was killed is adopted (and stopped when done); two demos never share one
(each runs its own simulated clock). The URL rules that decide whether this is needed at all
are `harel_beanie.deploy.where`'s.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any, Optional

from harel_beanie.core.errors import ConfigError

#: The file a command owning the embedded server leaves in the data folder.
HANDOFF_FILE = "server.json"
#: The file `harel-beanie server` holds locked while it runs: two started at once on one
#: folder cannot both miss each other's handoff file.
LOCK_FILE = "server.lock"


class LocalServer:
    """The embedded server for a data folder: started here (and stopped on `close`), or
    joined if another command already runs one on that folder. A server whose owner died
    without stopping it (killed) is adopted: used, and stopped on `close`. `command` names
    the command, so two demos never share one server (their clocks would disagree)."""

    def __init__(self, data_dir: Path, command: str = "", port: Optional[int] = None) -> None:
        self.data_dir = data_dir
        self.command = command
        self.port = port
        self.url = ""
        self.mode = ""  # "started", "joined" or "adopted"
        self._server: Optional[Any] = None  # an EmbeddedServer
        self._adopted: Optional[int] = None  # the pid of an adopted server

    @property
    def handoff(self) -> Path:
        return self.data_dir / HANDOFF_FILE

    @property
    def owns(self) -> bool:
        return self.mode in ("started", "adopted")

    def open(self) -> str:
        info = self._live_server()
        if info is not None:
            self.url = f"mongodb://127.0.0.1:{info['port']}"
            if _alive(info["owner"]):
                if self.command == "demo" and info.get("command") == "demo":
                    raise ConfigError(
                        f"another demo (pid {info['owner']}) is running on {self.data_dir}/: "
                        "wait for it, or pass --data DIR"
                    )
                self.mode = "joined"
            else:
                self.mode = "adopted"
                self._adopted = info["pid"]
                self._write(info["port"], info["pid"])
            return self.url
        from harel_beanie.deploy.embedded import BOUNDED_MEMORY, EmbeddedServer

        self.data_dir.mkdir(parents=True, exist_ok=True)
        # the memory bound, unless the user's environment sets the allocator otherwise
        env = {k: v for k, v in BOUNDED_MEMORY.items() if k not in os.environ}
        server = EmbeddedServer(self.data_dir / "db", port=self.port, log_path=self.data_dir / "server.log", env=env)
        try:
            server.start()
        except FileNotFoundError as exc:  # secantusd-py is not installed
            raise ConfigError(str(exc)) from None
        except (RuntimeError, TimeoutError) as exc:
            server.stop(kill=True)
            raise ConfigError(f"the embedded server did not start: {exc}") from None
        self._server = server
        self.mode = "started"
        self.url = server.url
        assert server.proc is not None
        self._write(server.port, server.proc.pid)
        return self.url

    def _write(self, port: int, pid: int) -> None:
        self.handoff.write_text(json.dumps({"port": port, "pid": pid, "owner": os.getpid(), "command": self.command}))

    def running(self) -> Optional[dict[str, Any]]:
        """The handoff record (`port`, `pid`, `owner`, `command`) of a server that answers on
        this folder, if any: what `harel-beanie server` refuses to start beside."""
        return self._live_server()

    def _live_server(self) -> Optional[dict[str, Any]]:
        """The handoff record of a server that still answers on this folder, if any."""
        try:
            info = json.loads(self.handoff.read_text())
            info["port"], info["pid"], info["owner"] = int(info["port"]), int(info["pid"]), int(info["owner"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if info["owner"] == os.getpid() or not _is_embedded_server(info["pid"]):
            return None
        try:
            with socket.create_connection(("127.0.0.1", info["port"]), timeout=0.5):
                return dict(info)
        except OSError:
            return None

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        elif self._adopted is not None:
            _stop_pid(self._adopted)
            self._adopted = None
        else:
            return
        try:
            self.handoff.unlink()
        except OSError:
            pass


def _is_embedded_server(pid: int) -> bool:
    """Whether `pid` is a running `secantusd-py` (what the handoff file says it is)."""
    try:
        return b"secantusd" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return _alive(pid)  # no /proc: trust the record if the process exists


def _stop_pid(pid: int, grace: float = 15.0) -> None:
    """Stop an adopted server and what it forked (it leads its own process group)."""

    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (killed, not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
