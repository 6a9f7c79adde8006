"""Start SecantusDB, a MongoDB wire-protocol server, as a child process.

For the demo, the tests and the benchmark on a machine with no MongoDB installed. SecantusDB
is GPL: this module never imports it, it only runs its `secantusd-py` command line, which
the `server` extra installs. Anything that can use a real server takes `MONGODB_URL` first.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

COMMAND = "secantusd-py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command() -> str:
    """The path of `secantusd-py`: beside this interpreter first (a venv), then on PATH."""
    beside = Path(sys.executable).parent / COMMAND
    if beside.exists():
        return str(beside)
    found = shutil.which(COMMAND)
    if found is None:
        raise FileNotFoundError(
            f"{COMMAND} not found: install the embedded server with `pip install 'harel-beanie[server]'`, "
            "or set MONGODB_URL to a MongoDB server"
        )
    return found


#: the environment that keeps the server's memory to what its largest read needs. A read the
#: server cannot answer from an index decodes the whole collection in Python (about 10 KB an
#: execution); glibc keeps what each connection's thread freed in a pool of its own (up to 8
#: per core), so with many connections the server held 9.4 GB at 300,000 executions. One pool
#: holds it to the cache and about one such read (400,000 executions with a 256 MB cache:
#: 0.4 GB after seeding them, 4.3 GB at the peak of a read of all; docs/embedded-server.md)
BOUNDED_MEMORY = {"MALLOC_ARENA_MAX": "1"}


class EmbeddedServer:
    """One SecantusDB child process, on 127.0.0.1 unless told otherwise. Use as a context
    manager, or `start()` / `stop()`. `storage` is a directory that survives restarts, or None
    for a throwaway one. `standalone` makes it answer as a standalone mongod (the design's
    case, and faster). `bind`, `reach` and `wrapper` place it elsewhere: the address it
    listens on, the address this process reaches it at, and a command prefix it runs under
    (the network-fault tests run it in a namespace of its own with `ip netns exec NS`).
    `env` adds to its environment (see `BOUNDED_MEMORY`)."""

    def __init__(
        self,
        storage: Optional[os.PathLike[str] | str] = None,
        *,
        port: Optional[int] = None,
        standalone: bool = True,
        test_commands: bool = False,
        auth: bool = False,
        extra_args: Sequence[str] = (),
        log_path: Optional[os.PathLike[str] | str] = None,
        bind: str = "127.0.0.1",
        reach: Optional[str] = None,
        wrapper: Sequence[str] = (),
        env: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.storage = None if storage is None else Path(storage)
        self.port = port or free_port()
        self.standalone = standalone
        self.test_commands = test_commands
        self.auth = auth
        self.extra_args = list(extra_args)
        self.log_path = Path(log_path) if log_path else Path(tempfile.gettempdir()) / f"secantus-{self.port}.log"
        self.bind, self.reach, self.wrapper = bind, reach or bind, list(wrapper)
        self.env = dict(env or {})
        self.proc: Optional[subprocess.Popen[bytes]] = None

    @property
    def url(self) -> str:
        return f"mongodb://{self.reach}:{self.port}"

    def args(self) -> list[str]:
        storage = ":memory:" if self.storage is None else str(self.storage)
        out = [*self.wrapper, server_command(), "--host", self.bind, "--port", str(self.port)]
        out += ["--storage-path", storage]
        out += ["--log-level", "ERROR"]
        if self.standalone:
            out.append("--standalone")
        if self.test_commands:
            out.append("--enable-test-commands")
        if self.auth:
            out.append("--auth")
        return out + self.extra_args

    def start(self, timeout: float = 60.0) -> "EmbeddedServer":
        if self.storage is not None:
            self.storage.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        # its own process group, so stopping it also stops anything it forks
        env = {**os.environ, **self.env} if self.env else None
        self.proc = subprocess.Popen(self.args(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        log.close()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{COMMAND} exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with socket.create_connection((self.reach, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"{COMMAND} did not listen on port {self.port} within {timeout}s; see {self.log_path}")

    def stop(self, kill: bool = False) -> None:
        """Stop the server (SIGTERM, then SIGKILL after a grace period; `kill` skips the grace)."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
            os.killpg(self.proc.pid, signal.SIGCONT)  # a paused server acts on the SIGTERM only once it runs
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP the server: it keeps its sockets and answers nothing (a VM paused by its
        hypervisor, a long GC stall) until `resume()`."""
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGCONT)

    def __enter__(self) -> "EmbeddedServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
