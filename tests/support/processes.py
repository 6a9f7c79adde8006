"""Ending the child processes the tests start (workers, servers): asked first, then made."""

from __future__ import annotations

import asyncio
import signal
from typing import Any


async def terminate(proc: Any, grace: float = 60.0) -> None:
    """SIGTERM `proc` (an asyncio subprocess) and wait up to `grace` seconds for it to finish
    what it holds; SIGKILL it if it has not, so a test never hangs on a stuck child."""
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), timeout=grace)
    except asyncio.TimeoutError:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
