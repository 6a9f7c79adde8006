"""Live pages: one change feed per dashboard, pushed to every open page as server-sent events.

Why this module exists, and why server-sent events: a page should show a commit without a
reload, and a dashboard in front of many staff should not multiply the database's work by
its tabs. So each dashboard keeps ONE watcher of the store's executions collection (a change
stream where the server has one, the same `Wakeups` the transport's idle claims use; a tick
every `poll` seconds where it has none), and each open page holds one `EventSource`
connection that is told "changed" (at most once a second). The page then fetches itself again
and swaps in the parts marked `data-live` (the filters a person is typing into stay as they
are). Short polling of the JSON twins would have every tab query the database on its own
clock; here a quiet database costs nothing but the one stream. The page closes its connection
while its tab is hidden, and reads again when it is shown.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Optional

from harel_beanie.transport.wakeups import Wakeups

#: at most one "changed" a second per page, however busy the store
MIN_GAP = 1.0
#: a comment line this often keeps proxies from closing an idle stream
HEARTBEAT = 15.0
#: a page's stream ends after this long; its EventSource opens a new one by itself
MAX_STREAM = 600.0


class LiveFeed:
    """The dashboard's one watcher of its store's executions, and the pages listening."""

    def __init__(self, poll: float = 5.0) -> None:
        self.poll = poll
        self._wakeups: Optional[Wakeups] = None

    def start(self, db: Any, executions: str) -> Wakeups:
        """Watch `executions` of `db` (once; on the running loop)."""
        if self._wakeups is None:
            # every change of the executions: a page shows them all
            self._wakeups = Wakeups(db, [{"$match": {"ns.coll": executions}}], self.poll)
            self._wakeups.start()
        return self._wakeups

    async def events(self, wakeups: Wakeups, is_gone: Any) -> AsyncIterator[str]:
        """The server-sent events of one page: `changed` when the store changed (or, without a
        stream, every `poll` seconds), a heartbeat comment while nothing does."""
        yield "retry: 3000\n\n"
        started = last = time.monotonic()
        seen = wakeups.generation
        while time.monotonic() - started < MAX_STREAM:
            if await is_gone():
                return
            await wakeups.wait(seen, HEARTBEAT if wakeups.mode == "stream" else self.poll)
            if wakeups.generation != seen or wakeups.mode != "stream":
                seen = wakeups.generation
                gap = MIN_GAP - (time.monotonic() - last)
                if gap > 0:
                    await asyncio.sleep(gap)
                last = time.monotonic()
                yield f"event: changed\ndata: {wakeups.mode}\n\n"
            else:
                yield ": still here\n\n"

    async def close(self) -> None:
        if self._wakeups is not None:
            await self._wakeups.close()
            self._wakeups = None
