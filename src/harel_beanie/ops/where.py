"""Where a command's data lives: the server URL, database and prefix it was given, or the
embedded server on the working directory's data folder.

Every `harel-beanie` command needs the same answer, so it is worked out once here:

- A URL from `--url`, else `HAREL_MONGO_URL` (what harel's own worker reads), else
  `MONGODB_URL` (what the tests and `make` read). The database from `--db`, else
  `HAREL_MONGO_DB`, else `harel`; the collection prefix from `--prefix`, else `HAREL_PREFIX`,
  else `harel` — the same defaults as harel's worker, so both find the same data.
- With no URL, `demo`, `status` and `monitor` use an embedded SecantusDB (a child process,
  `harel_beanie.ops.embedded`) whose storage is a folder under the working directory
  (`./harel-beanie-data` unless `--data`). While a command owns that server it leaves a small
  `server.json` in the folder, so a second command run meanwhile (say `status` beside a
  running `demo`) joins the same server instead of starting another on the same files; a
  server whose command was killed is taken over (and stopped when done); two demos never
  share one (each runs its own simulated clock).
- The CLI's connect policy is short (5 pings, 0.5 s apart, 1 s each) so an unreachable URL
  gets an answer within seconds; `--connect-attempts` / `--connect-timeout` lengthen it.

Anything wrong with these settings raises `ConfigError`, which the CLI prints as one line.
"""

from __future__ import annotations

import json
import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

from harel_beanie.core.errors import ConfigError
from harel_beanie.store.connect import RetryPolicy, mask_url

#: Where every command looks for its server, database and prefix when no flag names them:
#: the variables harel's own worker reads (then the tests' `MONGODB_URL`), so both find the
#: same data by default.
URL_ENV = ("HAREL_MONGO_URL", "MONGODB_URL")
DB_ENV = "HAREL_MONGO_DB"
PREFIX_ENV = "HAREL_PREFIX"
DEFAULT_DB = "harel"
DEFAULT_DATA_DIR = "harel-beanie-data"
HANDOFF_FILE = "server.json"
CLI_RETRY = RetryPolicy(attempts=5, delay=0.5, timeout_ms=1000)


@dataclass
class Target:
    """The resolved place a command reads and writes."""

    url: str
    db: str
    prefix: str
    retry: RetryPolicy
    source: str  # where the URL came from: "--url", an environment variable, or "embedded"
    data_dir: Optional[Path] = None  # the embedded server's folder, when it is the embedded one

    @property
    def masked_url(self) -> str:
        return mask_url(self.url)

    @property
    def embedded(self) -> bool:
        return self.data_dir is not None


def url_from(flag: Optional[str], env: Mapping[str, str]) -> tuple[Optional[str], str]:
    """The URL and where it came from (`None, ""` when none is set)."""
    found: tuple[Optional[str], str] = (None, "")
    if flag:
        found = flag, "--url"
    else:
        for var in URL_ENV:
            if env.get(var):
                found = env[var], var
                break
    url, source = found
    if url is not None and not url.lower().startswith(("mongodb://", "mongodb+srv://")):
        raise ConfigError(f"{mask_url(url)} (from {source}) is not a MongoDB URL: expected mongodb://host[:port]")
    return found


def retry_policy(attempts: Optional[int], timeout: Optional[float]) -> RetryPolicy:
    policy = CLI_RETRY
    if attempts is not None:
        if attempts < 1:
            raise ConfigError(f"--connect-attempts must be at least 1, got {attempts}")
        policy = RetryPolicy(attempts=attempts, delay=policy.delay, timeout_ms=policy.timeout_ms)
    if timeout is not None:
        if timeout <= 0:
            raise ConfigError(f"--connect-timeout must be positive, got {timeout}")
        policy = RetryPolicy(attempts=policy.attempts, delay=policy.delay, timeout_ms=max(1, int(timeout * 1000)))
    return policy


def prefix_from(flag: Optional[str], env: Mapping[str, str]) -> str:
    """The collection prefix (`--prefix`, else `HAREL_PREFIX`, else harel's default),
    checked by harel's own rule for collection names."""
    from harel.engine.schema import DEFAULT_PREFIX, Names

    prefix, source = (flag, "--prefix") if flag else (env.get(PREFIX_ENV), PREFIX_ENV)
    if not prefix:
        return str(DEFAULT_PREFIX)
    try:
        Names(prefix)
    except ValueError as exc:
        raise ConfigError(f"{source}: prefix {prefix!r} is refused: {exc}") from None
    return prefix


def db_from(flag: Optional[str], env: Mapping[str, str]) -> str:
    """The database (`--db`, else `HAREL_MONGO_DB`, else harel), checked by the store's own
    rule (`StoreSettings`), so a command refuses in one line exactly what the store would
    refuse deep inside."""
    from harel_beanie.store.settings import StoreSettings

    db, source = (flag, "--db") if flag else (env.get(DB_ENV), DB_ENV)
    if not db:
        return DEFAULT_DB
    try:
        StoreSettings(db_name=db)
    except ValueError:
        raise ConfigError(f"{source}: {db!r} is not a MongoDB database name") from None
    return db


def db_and_prefix(db: Optional[str], prefix: Optional[str], env: Mapping[str, str]) -> tuple[str, str]:
    """The database and prefix (see `db_from`, `prefix_from`)."""
    return db_from(db, env), prefix_from(prefix, env)


# --- the embedded server on the data folder --------------------------------------------------


class LocalServer:
    """The embedded server for a data folder: started here (and stopped on `close`), or
    joined if another command already runs one on that folder. A server whose owner died
    without stopping it (killed) is adopted: used, and stopped on `close`. `command` names
    the command, so two demos never share one server (their clocks would disagree)."""

    def __init__(self, data_dir: Path, command: str = "") -> None:
        self.data_dir = data_dir
        self.command = command
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
        from harel_beanie.ops.embedded import EmbeddedServer

        self.data_dir.mkdir(parents=True, exist_ok=True)
        server = EmbeddedServer(self.data_dir / "db", log_path=self.data_dir / "server.log")
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
    import signal
    import time

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


@contextmanager
def resolve(
    *,
    url: Optional[str],
    db: Optional[str],
    prefix: Optional[str],
    attempts: Optional[int] = None,
    timeout: Optional[float] = None,
    data: Optional[str] = None,
    embedded_ok: bool = True,
    say: Callable[[str], None] = print,
    env: Optional[Mapping[str, str]] = None,
    command: str = "",
) -> Iterator[Target]:
    """The command's `Target`. With no URL and `embedded_ok`, the embedded server on the
    data folder (started, joined or adopted: see `LocalServer`), stopped on exit if this
    command owns it; `say` announces which. With no URL and not `embedded_ok`, a `ConfigError`."""
    env = os.environ if env is None else env
    found, source = url_from(url, env)
    db_name, prefix_name = db_and_prefix(db, prefix, env)
    policy = retry_policy(attempts, timeout)
    if found is not None:
        yield Target(found, db_name, prefix_name, policy, source)
        return
    if not embedded_ok:
        raise ConfigError("no MongoDB URL: pass --url or set HAREL_MONGO_URL (or MONGODB_URL)")
    folder = Path(data or env.get("HAREL_BEANIE_DATA") or DEFAULT_DATA_DIR)
    local = LocalServer(folder, command)
    try:
        url_now = local.open()
        if local.mode == "started":
            say(f"No MONGODB_URL set: started the embedded MongoDB server (SecantusDB), data in {folder}/")
        elif local.mode == "joined":
            say(f"No MONGODB_URL set: using the embedded server another harel-beanie command runs on {folder}/")
        else:
            say(f"No MONGODB_URL set: taking over the embedded server left running on {folder}/")
        yield Target(url_now, db_name, prefix_name, policy, "embedded", data_dir=folder)
    finally:
        if local.owns:
            say(f"Stopping the embedded server (its data stays in {folder}/).")
        local.close()
