"""Connecting to a server that may not be up yet, and naming it safely in errors.

A worker started beside its database (compose, a test, CI) must wait for it rather than
crash, and an error must name the server without leaking the password in the URL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

_CREDENTIALS = re.compile(r"^(?P<scheme>mongodb(?:\+srv)?://)(?P<userinfo>[^@/]*)@", re.IGNORECASE)


def mask_url(url: str) -> str:
    """`url` with any password replaced by `***` (the user name is kept)."""
    m = _CREDENTIALS.match(url)
    if not m:
        return url
    user = m.group("userinfo").split(":", 1)[0]
    return f"{m.group('scheme')}{user}:***@{url[m.end():]}"


@dataclass(frozen=True)
class RetryPolicy:
    """How long `from_url` keeps trying: `attempts` pings, `delay` seconds apart, each ping
    waiting at most `timeout_ms` for a server to answer."""

    attempts: int = 30
    delay: float = 1.0
    timeout_ms: int = 2000

    def pauses(self) -> Iterator[float]:
        """The pause before each attempt after the first."""
        for i in range(self.attempts):
            yield 0.0 if i == 0 else self.delay


def unreachable_message(url: str, policy: RetryPolicy, last: BaseException | None) -> str:
    return (
        f"MongoDB at {mask_url(url)} did not answer a ping after {policy.attempts} attempts "
        f"over about {policy.delay * (policy.attempts - 1):.0f}s: {type(last).__name__ if last else 'no reply'}"
        + (f": {last}" if last else "")
    )
