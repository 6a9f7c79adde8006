"""Where a command's data lives: the server URL, database and prefix it was given, or the
embedded server on the working directory's data folder.

Every `harel-beanie` command needs the same answer, so it is worked out once here:

- A URL from `--url`, else `HAREL_MONGO_URL` (what harel's own worker reads), else
  `MONGODB_URL` (what the tests and `make` read). The database from `--db`, else
  `HAREL_MONGO_DB`, else `harel`; the collection prefix from `--prefix`, else `HAREL_PREFIX`,
  else `harel` — the same defaults as harel's worker, so both find the same data.
- With no URL, `demo`, `status` and `monitor` use an embedded SecantusDB (a child process,
  `harel_beanie.deploy.embedded`) whose storage is a folder under the working directory
  (`./harel-beanie-data` unless `--data`). While a command owns that server it leaves a small
  `server.json` in the folder, so a second command run meanwhile (say `status` beside a
  running `demo`) joins the same server instead of starting another on the same files; a
  server whose command was killed is taken over (and stopped when done); two demos never
  share one (each runs its own simulated clock).
- A server `harel-beanie server` runs on that folder is used by every command started there
  with no URL, the worker and the migrations included (what its banner promises); each says
  so first, naming the URL.
- A database named by mistake is told apart from a new one by one rule (`mistyped_db`): the
  named database holds no harel-beanie collections while another on the server does.
- The CLI's connect policy is short (5 pings, 0.5 s apart, 1 s each) so an unreachable URL
  gets an answer within seconds; `--connect-attempts` / `--connect-timeout` lengthen it.

Anything wrong with these settings raises `ConfigError`, which the CLI prints as one line.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

from harel_beanie.core.errors import ConfigError
from harel_beanie.deploy.local_server import LocalServer
from harel_beanie.store.connect import RetryPolicy, mask_url

#: Where every command looks for its server, database and prefix when no flag names them:
#: the variables harel's own worker reads (then the tests' `MONGODB_URL`), so both find the
#: same data by default.
URL_ENV = ("HAREL_MONGO_URL", "MONGODB_URL")
DB_ENV = "HAREL_MONGO_DB"
PREFIX_ENV = "HAREL_PREFIX"
DEFAULT_DB = "harel"
DEFAULT_DATA_DIR = "harel-beanie-data"
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

#: a `Target.source` saying the URL is that of the server `harel-beanie server` runs here
SERVER_SOURCE = "harel-beanie server"


def served_here(folder: Path) -> Optional[str]:
    """The URL of the server `harel-beanie server` runs on `folder`, if one answers there (the
    embedded servers other commands start for themselves come and go with them: only the
    commands that may start one join those, through `LocalServer`)."""
    info = LocalServer(folder).running()
    if info is None or info.get("command") != SERVER_SOURCE.split()[-1]:
        return None
    return f"mongodb://127.0.0.1:{info['port']}"


def no_data_message(folder: Path, given: bool) -> str:
    """What a reading command says in a folder with no data and no URL: what it found, and
    the commands that make data or name a server."""
    elsewhere = "check --data (or $HAREL_BEANIE_DATA), " if given else ""
    return (
        f"no MongoDB URL set and no data folder {folder}/ here: nothing to read. Run `harel-beanie demo` to "
        f"make some (or `harel-beanie server` for an empty server); {elsewhere}pass --url or set MONGODB_URL "
        "for your own server"
    )


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
    makes_data: bool = True,
) -> Iterator[Target]:
    """The command's `Target`. With no URL and `embedded_ok`, the embedded server on the
    data folder (started, joined or adopted: see `LocalServer`), stopped on exit if this
    command owns it; `say` announces which. With no URL and not `embedded_ok`, a `ConfigError`;
    with no URL, no data folder and not `makes_data` (a command that only reads), a
    `ConfigError` saying what to run: a folder made for it would hold nothing to read."""
    env = os.environ if env is None else env
    found, source = url_from(url, env)
    db_name, prefix_name = db_and_prefix(db, prefix, env)
    policy = retry_policy(attempts, timeout)
    if found is not None:
        yield Target(found, db_name, prefix_name, policy, source)
        return
    folder = Path(data or env.get("HAREL_BEANIE_DATA") or DEFAULT_DATA_DIR)
    served = served_here(folder)
    if served is not None:  # the banner of `harel-beanie server` promised it: every command uses it
        say(f"using the server `harel-beanie server` runs in this folder: {served} (data in {folder}/)")
        yield Target(served, db_name, prefix_name, policy, SERVER_SOURCE, data_dir=folder)
        return
    if not embedded_ok:
        raise ConfigError(
            "no MongoDB URL: pass --url or set HAREL_MONGO_URL (or MONGODB_URL), or start `harel-beanie server` "
            "in this folder"
        )
    if not makes_data and not folder.is_dir():
        raise ConfigError(no_data_message(folder, given=bool(data or env.get("HAREL_BEANIE_DATA"))))
    with _embedded(folder, command, say) as url_now:
        yield Target(url_now, db_name, prefix_name, policy, "embedded", data_dir=folder)


@contextmanager
def _embedded(folder: Path, command: str, say: Callable[[str], None]) -> Iterator[str]:
    """The URL of the embedded server on `folder`, started, joined or adopted (`LocalServer`),
    and stopped on exit if this command owns it; `say` announces which."""
    local = LocalServer(folder, command)
    try:
        url_now = local.open()
        if local.mode == "started":
            say(f"No MONGODB_URL set: started the embedded MongoDB server (SecantusDB), data in {folder}/")
        elif local.mode == "joined":
            say(f"No MONGODB_URL set: using the embedded server another harel-beanie command runs on {folder}/")
        else:
            say(f"No MONGODB_URL set: taking over the embedded server left running on {folder}/")
        yield url_now
    finally:
        if local.owns:
            say(f"Stopping the embedded server (its data stays in {folder}/).")
        local.close()


# --- a database named by mistake -------------------------------------------------------------

#: the server's own databases: never an app's
SYSTEM_DBS = ("admin", "config", "local")


async def mistyped_db(client: Any, db: str, prefix: str) -> Optional[str]:
    """What to say when `db` looks mistyped: it holds no collection of `prefix` (no harel-beanie
    data) while another database on the server holds executions. The one rule every command
    that reads or removes data applies (`status`, `migrate status`, `prune`, `dashboard`), so
    none tells a user to migrate, prune or watch a database that does not exist. `None` when
    `db` holds data, or when no other database does (a new deployment's first run).
    `client` is PyMongo's async client."""
    from difflib import SequenceMatcher

    mine = f"{prefix}_"
    if any(name.startswith(mine) for name in await client[db].list_collection_names()):
        return None
    found: list[tuple[str, str]] = []
    for name in await client.list_database_names():
        if name in SYSTEM_DBS or name == db:
            continue
        for coll in await client[name].list_collection_names():
            if coll.endswith("_executions"):
                found.append((name, coll.removesuffix("_executions")))
    if not found:
        return None

    def likeness(where: tuple[str, str]) -> tuple[bool, float]:
        return where[1] == prefix, SequenceMatcher(None, where[0], db).ratio()

    name, theirs = max(found, key=likeness)
    flags = f"--db {name}" + ("" if theirs == prefix else f" --prefix {theirs}")
    return f"no harel-beanie data in {db!r}; did you mean {name!r}? ({flags})"
