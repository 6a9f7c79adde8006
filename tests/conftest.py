"""Shared fixtures: one real MongoDB wire-protocol server for the whole run.

With `MONGODB_URL` set, every test runs against that server (any mongod, replica set or
Atlas). Otherwise the session starts SecantusDB as a child process (`harel_beanie.embedded`)
and stops it at the end. Each test gets a database of its own, dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, AsyncIterator, Iterator

import pymongo
import pytest

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.embedded import EmbeddedServer


@pytest.fixture(scope="session")
def mongo_url() -> Iterator[str]:
    url = os.environ.get("MONGODB_URL")
    if url:
        yield url
        return
    with EmbeddedServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def client(mongo_url: str) -> Iterator[pymongo.MongoClient[Any]]:
    c: pymongo.MongoClient[Any] = pymongo.MongoClient(mongo_url)
    yield c
    c.close()


@pytest.fixture
def db_name(client: pymongo.MongoClient[Any]) -> Iterator[str]:
    name = "hbt_" + uuid.uuid4().hex[:12]
    yield name
    client.drop_database(name)


@pytest.fixture
def store(mongo_url: str, db_name: str) -> Iterator[MongoStore]:
    s = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    yield s
    s.close()


@pytest.fixture
async def astore(mongo_url: str, db_name: str) -> AsyncIterator[AsyncMongoStore]:
    s = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db_name)
    yield s
    await s.close()


@pytest.fixture(params=["sync", "async"])
def either(request: pytest.FixtureRequest, mongo_url: str, db_name: str) -> Iterator[Any]:
    """The sync store, then the async one behind a blocking facade (tests/both.py)."""
    from tests.both import stores

    yield from stores(request.param, mongo_url, db_name)


@pytest.fixture
def record_figure(request: pytest.FixtureRequest) -> Any:
    """`record_figure(name, value)`: a figure this test produced, for docs/RELIABILITY.md."""
    figures = request.node.stash.setdefault(_FIGURES, {})
    return figures.__setitem__


_FIGURES = pytest.StashKey[dict[str, Any]]()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The side-by-side counts of harel's suite on harel's store and on this one."""
    from tests.harel_suite import REPORT

    if REPORT:
        terminalreporter.section("harel's own tests: harel's Mongo stores beside harel_beanie's")
        for line in REPORT:
            terminalreporter.write_line(line)
