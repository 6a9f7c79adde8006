"""Connecting to a server that may not be up yet, and naming it safely in errors.

A worker started beside its database (compose, a test, CI) must wait for it rather than
crash, and an error must name the server without leaking the password in the URL.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

from pymongo.errors import ConfigurationError, PyMongoError

from harel_beanie.core.arguments import require_int, require_seconds, require_str
from harel_beanie.core.errors import StoreUnavailable

#: the most pings `from_url` makes, and the longest pause between two
MAX_ATTEMPTS, MAX_RETRY_DELAY = 1000, 3600.0

_CREDENTIALS = re.compile(r"^(?P<scheme>mongodb(?:\+srv)?://)(?P<userinfo>[^@/]*)@", re.IGNORECASE)


def mask_url(url: str) -> str:
    """`url` with any password replaced by `***` (the user name is kept)."""
    m = _CREDENTIALS.match(require_str("url", url))
    if not m:
        return url
    user = m.group("userinfo").split(":", 1)[0]
    return f"{m.group('scheme')}{user}:***@{url[m.end() :]}"


@dataclass(frozen=True)
class RetryPolicy:
    """How long `from_url` keeps trying: `attempts` pings, `delay` seconds apart, each ping
    waiting at most `timeout_ms` for a server to answer."""

    attempts: int = 30
    delay: float = 1.0
    timeout_ms: int = 2000

    def __post_init__(self) -> None:
        # every wait bounded: an hour between attempts, a minute a ping, a thousand attempts
        require_int("attempts", self.attempts, low=1, high=MAX_ATTEMPTS)
        require_seconds("delay", self.delay, high=MAX_RETRY_DELAY)
        require_int("timeout_ms", self.timeout_ms, low=1, high=60_000)

    def client_settings(self, extra: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
        """Keyword arguments for a client (PyMongo's, either API, or Motor's) that gives up
        on a server after `timeout_ms`, plus `extra` (listeners, TLS, ...), which wins."""
        return {"serverSelectionTimeoutMS": self.timeout_ms, **(extra or {})}

    def overridden(self, attempts: Optional[int] = None, delay: Optional[float] = None) -> "RetryPolicy":
        """This policy with harel's `from_url(url, db_name, connect_retries, retry_delay)`
        arguments applied where given."""
        if attempts is not None:  # named as harel's from_url names it, and as this method does
            attempts = require_int("attempts (connect_retries)", attempts, low=1, high=MAX_ATTEMPTS)
        if delay is not None:
            delay = require_seconds("delay (retry_delay)", delay, high=MAX_RETRY_DELAY)
        return RetryPolicy(
            self.attempts if attempts is None else attempts, self.delay if delay is None else delay, self.timeout_ms
        )

    def pauses(self) -> Iterator[float]:
        """The pause before each attempt after the first."""
        for i in range(self.attempts):
            yield 0.0 if i == 0 else self.delay


#: Where the driver's own additions to a message start: its timeout settings, its topology
#: description, the server's whole reply.
_DRIVER_TAILS = (" (configured timeouts", ", Timeout:", ", full error:")


def driver_message(err: BaseException, limit: int = 240) -> str:
    """What went wrong, in the driver's words, on one line: its first clause (refused,
    unknown host, authentication failed, ...) without the timeout settings, topology dump or
    full server reply it appends, any password in a URL masked, at most `limit` characters."""
    text = str(err).strip()
    text = text.splitlines()[0] if text else type(err).__name__
    for tail in _DRIVER_TAILS:
        text = text.split(tail, 1)[0]
    return mask_url(text)[:limit]


def unreachable_message(url: str, attempts: int, elapsed: float, last: BaseException | None) -> str:
    """What a give-up says: the attempts made and the time they really took (each ping's own
    wait included, not only the pauses between them)."""
    reason = "no reply"
    if last is not None:
        reason = f"{type(last).__name__}: {driver_message(last)}"
    tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
    return f"MongoDB at {mask_url(url)} did not answer a ping after {tries} over {elapsed:.1f}s: {reason}"


def wait_for_server(make_client: Callable[[], Any], url: str, retry: RetryPolicy) -> Any:
    """A client from `make_client()` once its server answers a ping, retried per `retry`.
    A malformed URL (ConfigurationError) is raised at once: retrying cannot fix it."""
    require_str("url", url)
    last: Optional[BaseException] = None
    started = time.monotonic()
    for pause in retry.pauses():
        time.sleep(pause)
        client = make_client()
        try:
            client.admin.command("ping")
            return client
        except ConfigurationError:
            client.close()
            raise
        except PyMongoError as exc:
            last = exc
            client.close()
    raise StoreUnavailable(unreachable_message(url, retry.attempts, time.monotonic() - started, last))


async def await_server(make_client: Callable[[], Any], url: str, retry: RetryPolicy) -> Any:
    """`wait_for_server` for an async client (PyMongo's or Motor's)."""
    require_str("url", url)
    last: Optional[BaseException] = None
    started = time.monotonic()
    for pause in retry.pauses():
        await asyncio.sleep(pause)
        client = make_client()
        try:
            await client.admin.command("ping")
            return client
        except ConfigurationError:
            await _close(client)
            raise
        except PyMongoError as exc:
            last = exc
            await _close(client)
    raise StoreUnavailable(unreachable_message(url, retry.attempts, time.monotonic() - started, last))


async def _close(client: Any) -> None:
    closing = client.close()  # a coroutine on PyMongo's async client, None on Motor's
    if inspect.isawaitable(closing):
        await closing
