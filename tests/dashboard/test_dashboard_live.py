"""The live pages' feed, read as a browser's EventSource reads it (`/live` of the standalone
`harel-beanie dashboard`, over HTTP):

- where the server has change streams (a one-member replica set), a commit is told to the page
  as `changed` (`data: stream`) within a second or two, and a quiet database sends nothing
  but heartbeats: the page reads again because the store changed, not on a clock;
- where it has none (a standalone server), the page is told `changed` (`data: poll`) on the
  feed's tick.
"""

from __future__ import annotations

import queue
import threading
import time
import urllib.request
import uuid
from contextlib import contextmanager
from typing import Iterator

import pymongo
import pytest
from harel.engine.execution import Execution, Status

from harel_beanie import MongoStore
from harel_beanie.deploy.embedded import EmbeddedServer
from tests.support.browser import Dashboard

TOKEN = "live-token"
#: the feed's tick on a server without change streams (harel_beanie.dashboard.live)
POLL = 5.0


@pytest.fixture(scope="module")
def rs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """SecantusDB as a one-member replica set: change streams on."""
    server = EmbeddedServer(tmp_path_factory.mktemp("rs-live"), standalone=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Feed:
    """The lines of one page's `/live` stream, read on a thread of their own."""

    def __init__(self, dash: Dashboard) -> None:
        request = urllib.request.Request(dash.base + "/live", headers={"Authorization": f"Bearer {TOKEN}"})
        self.response = urllib.request.urlopen(request, timeout=60)
        assert self.response.headers["content-type"].startswith("text/event-stream")
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for raw in self.response:
                self.lines.put(raw.decode().rstrip("\n"))
        except (OSError, ValueError, AttributeError):  # the test closed the response under the read
            pass

    def events(self, within: float, first: bool = False) -> list[str]:
        """The `data:` of every `changed` event read in the next `within` seconds (`first`:
        return at the first one)."""
        out, kind, deadline = [], "", time.monotonic() + within
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line.startswith("event: "):
                kind = line[len("event: ") :]
            elif line.startswith("data: ") and kind == "changed":
                out.append(line[len("data: ") :])
                kind = ""
                if first:
                    break
        return out

    def close(self) -> None:
        self.response.close()


@contextmanager
def _live(url: str) -> Iterator[tuple[Feed, MongoStore]]:
    """A database, the standalone dashboard over it, and one page's feed open."""
    db = "hbt_live_" + uuid.uuid4().hex[:8]
    store = MongoStore(pymongo.MongoClient(url), db)
    store.init()
    dash = Dashboard(url, db, TOKEN).wait()
    feed = Feed(dash)
    try:
        assert feed.lines.get(timeout=30).startswith("retry:")
        yield feed, store
    finally:
        feed.close()
        dash.stop()
        store.close()
        pymongo.MongoClient(url).drop_database(db)


def _commit(store: MongoStore) -> None:
    store.save(
        Execution(
            id=f"live-{uuid.uuid4().hex[:6]}", definition_id="Order", status=Status.RUNNING, updated_at=time.time()
        )
    )


def test_a_change_stream_tells_the_page_of_each_commit_and_nothing_else(rs_server: EmbeddedServer) -> None:
    with _live(rs_server.url) as (feed, store):
        # the dashboard opens its stream when the first page connects: commit until one is told
        told: list[str] = []
        for _ in range(10):
            _commit(store)
            if told := feed.events(within=3.0):
                break
        assert told and set(told) == {"stream"}, told
        feed.events(within=1.5)  # what the last commits still owed
        assert feed.events(within=POLL + 2) == []  # a quiet store: heartbeats only, no tick
        started = time.monotonic()
        _commit(store)
        assert feed.events(within=POLL, first=True) == ["stream"]
        assert time.monotonic() - started < 3.0  # told of the commit, not of a tick


def test_without_change_streams_the_page_is_told_on_the_feeds_tick(mongo_url: str) -> None:
    with pymongo.MongoClient(mongo_url) as client:
        if "setName" in client.admin.command("hello"):
            pytest.skip("the session's server has change streams (a replica set)")
    with _live(mongo_url) as (feed, _):
        assert feed.events(within=2 * POLL + 2)[:1] == ["poll"]
