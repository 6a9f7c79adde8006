"""What an idle claimer waits on: a change stream where the server has one, the clock where
it does not.

Why this module exists: harel's worker asks its transport for work in a loop and sleeps a
few milliseconds when there is none, so an idle worker polls the database hundreds of times
a second and still answers a publish only at its next poll. Here a claim that finds nothing
waits instead (`AsyncMongoTransport(idle_wait=...)`) until one of these comes first:

- a change on the database that may make work: a publish, a nack, an ack (the group may hold
  a message published while its head was in flight: the queues' `wake` counter), or a commit
  that arms a timer (the executions' `next_fire`), seen on one change stream of the database,
  filtered on the server to those;
- the moment the next waiting group's lease or park ends, or the store's next timer is due
  (the caller passes the earliest of these);
- `idle_wait` seconds, the safety net: the worker's loop gets control back at least that often.

The stream only makes the wake-up fast; it never decides what is claimable (the claim does,
on the documents), so a lost notification costs at most one `idle_wait`. Where the server
has no change streams (a standalone server, mongomock), or the stream breaks (a restart, a
failover, an invalidate), claimers poll every `poll_interval` instead, and the stream is
opened again, from the last resume token, with backoff.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

from pymongo.errors import OperationFailure, PyMongoError

log = logging.getLogger("harel_beanie.transport")

#: the server's answers that mean "this deployment has no change streams" (a standalone
#: mongod: 40573; not a replica set member; a fake client that lacks `watch`)
_NO_STREAMS = {40573, 40324}
#: the server's answers that mean the resume token is gone (start from now instead)
_TOKEN_LOST = {260, 280, 286}


def transport_pipeline(queues: str, executions: str) -> list[dict[str, Any]]:
    """The changes that may make work for an idle claim (see the module docstring)."""
    return [
        {
            "$match": {
                "$or": [
                    {"ns.coll": queues, "operationType": "insert"},
                    {"ns.coll": queues, "updateDescription.updatedFields.wake": {"$exists": True}},
                    {"ns.coll": executions, "updateDescription.updatedFields.next_fire": {"$exists": True}},
                    {"ns.coll": executions, "operationType": "insert", "fullDocument.next_fire": {"$exists": True}},
                ]
            }
        }
    ]


class Wakeups:
    """One database's wake-ups (for the changes `pipeline` selects) for its waiters: the idle
    claims of one transport instance, or the live pages of one dashboard.

    `generation` counts the notifications; a claimer reads it before it claims, and after a
    claim that found nothing waits (`wait`) until it changes or its deadline passes, so a
    notification between the claim and the wait is never missed."""

    def __init__(self, db: Any, pipeline: list[dict[str, Any]], poll_interval: float) -> None:
        self._db = db
        self._pipeline = pipeline
        self.poll_interval = poll_interval
        self.generation = 0
        self.mode = "poll"  # "stream" while a change stream is open
        self.opened = 0  # streams opened (a reopen after a break counts again)
        self.breaks = 0  # streams that broke
        self.notifications = 0
        self._changed = asyncio.Event()
        self._token: Optional[Any] = None
        self._task: Optional[asyncio.Task[None]] = None
        self._unsupported = False

    def start(self) -> None:
        """Open the stream in the background (on the running loop), once."""
        if self._task is None and not self._unsupported:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    def notify(self) -> None:
        """Something may have become claimable: every waiting claimer looks again."""
        self.generation += 1
        self.notifications += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait(self, generation: int, timeout: float) -> None:
        """Until a notification newer than `generation`, or `timeout` seconds (at most
        `poll_interval` while no stream is open)."""
        if self.generation != generation or timeout <= 0:
            return
        if self.mode != "stream":
            timeout = min(timeout, self.poll_interval)
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # closing: whatever the stream was doing
                pass
            self._task = None

    async def _watch(self) -> None:
        backoff = 0.25
        while True:
            try:
                opening = self._db.watch(self._pipeline, resume_after=self._token)
                stream = await opening if asyncio.iscoroutine(opening) else opening
                async with stream:
                    self.mode, backoff = "stream", 0.25
                    self.opened += 1
                    self.notify()  # whatever happened while it was closed: look once
                    async for _change in stream:
                        self._token = stream.resume_token
                        self.notify()
            except asyncio.CancelledError:
                raise
            except OperationFailure as exc:
                if exc.code in _NO_STREAMS:
                    self._unsupported, self.mode = True, "poll"
                    log.info("no change streams on this server: idle claimers poll every %ss", self.poll_interval)
                    return
                if exc.code in _TOKEN_LOST:
                    self._token = None
                self._broke(exc)
            except (PyMongoError, AttributeError, NotImplementedError) as exc:
                if isinstance(exc, (AttributeError, NotImplementedError)):  # a client without `watch`
                    self._unsupported, self.mode = True, "poll"
                    return
                self._broke(exc)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)

    def _broke(self, exc: BaseException) -> None:
        if self.mode == "stream":
            self.breaks += 1
            log.warning("the change stream broke (%s); idle claimers poll until it is open again", exc)
        self.mode = "poll"
        self.notify()  # the stream may have missed something: look now
