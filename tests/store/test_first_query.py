"""A typed query is an app's first use of the store: it works, or says what to run.

An app that opens the store and, first thing, queries its documents with Beanie (a page of
failed executions, say) must not depend on something else having set the store up first.
Each test runs in a fresh process, as an app's first request does: in this suite's process
the document classes were bound long ago by other tests, which would hide the fault.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from harel_beanie import MongoStore

#: what the app does, as docs/beanie-app.md shows it: open the store, then query
OPENED_THE_DOCUMENTED_WAY = """
import asyncio, sys
from harel_beanie import AsyncMongoStore, ExecutionDocument, queries

async def main(url, db):
    store = await AsyncMongoStore.from_url(url, db)
    failed = await ExecutionDocument.find(ExecutionDocument.status == "FAILED").to_list()
    done = await queries.children_of("order-1").to_list()
    print("failed", len(failed), "children", len(done))
    await store.close()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""

#: a store built on a client the app made, queried before anything set it up
BUILT_AND_NOT_SET_UP = """
import asyncio, sys
from pymongo import AsyncMongoClient
from harel_beanie import AsyncMongoStore, ExecutionDocument

async def main(url, db):
    store = AsyncMongoStore(AsyncMongoClient(url), db)
    for query in (
        lambda: ExecutionDocument.find(ExecutionDocument.status == "FAILED"),  # Beanie's fields
        lambda: ExecutionDocument.find({"status": "FAILED"}),  # a filter of the app's own
    ):
        try:
            await query().to_list()
        except Exception as exc:
            print(type(exc).__name__, exc, sep=": ")

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def _run(source: str, mongo_url: str, db_name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source), mongo_url, db_name],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one_failed(store: MongoStore) -> None:
    """A FAILED execution for the query to find (so an empty answer cannot pass by accident)."""
    from harel.engine.execution import Execution, Status

    store.commit(Execution(id="order-1", definition_id="Order", status=Status.FAILED), [])


def test_a_typed_query_right_after_opening_the_store(mongo_url: str, db_name: str, store: MongoStore) -> None:
    """`await AsyncMongoStore.from_url(...)`, then a typed query and one of
    `harel_beanie.queries`, first thing in a fresh process: both answer. Before, the query
    raised Beanie's `CollectionWasNotInitialized` (with no message) until something ran
    `store.init()` or a store operation."""
    _one_failed(store)
    proc = _run(OPENED_THE_DOCUMENTED_WAY, mongo_url, db_name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "failed 1 children 0", proc.stdout


def test_a_typed_query_before_set_up_names_what_to_run(mongo_url: str, db_name: str) -> None:
    """A store built on the app's own client is set up on first use (`await store.init()`
    does it at once). A typed query before that cannot work; it fails with one line naming
    `store.init()`, of the type it was before (an app catching it keeps doing so): a query
    on Beanie's fields was `AttributeError: status`, one with a filter of the app's own
    Beanie's `CollectionWasNotInitialized` with no message."""
    proc = _run(BUILT_AND_NOT_SET_UP, mongo_url, db_name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == ["AttributeError", "CollectionWasNotInitialized"], lines
    for line in lines:
        assert "ExecutionDocument is not bound to a database yet: run `await store.init()`" in line, line
