"""Layout step 4 (`harel_beanie.migrate.lean_indexes`) on the real server: down creates
`hb_pending` again and records 3, up drops it and records 4; neither reads or changes a
document, and a store of this version keeps relaying on layout 3 meanwhile."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator, Optional

import pymongo
import pytest
from harel import Event
from harel.engine.execution import Execution
from harel.engine.schema import DEFAULT_PREFIX, Names

from harel_beanie import MongoStore
from harel_beanie.core.documents import (
    LAYOUT_3_INDEXES,
    SCHEMA_MARKER_ID,
    SCHEMA_VERSION,
    ExecutionDocument,
    index_models,
)
from harel_beanie.migrate import PROGRESS_ID, Migrator, StepReport

DROPPED = {ix.document["name"] for ix in LAYOUT_3_INDEXES}
DECLARED = {ix.document["name"] for ix in index_models(ExecutionDocument)}


class Db:
    def __init__(self, client: pymongo.MongoClient[Any], url: str, name: str) -> None:
        self.url, self.name = url, name
        self.exes = client[name][Names(DEFAULT_PREFIX).executions]
        self.counters = client[name][Names(DEFAULT_PREFIX).counters]

    def migrate(self, direction: str, to: Optional[int] = None) -> list[StepReport]:
        async def run() -> list[StepReport]:
            client: Any = pymongo.AsyncMongoClient(self.url)
            try:
                m = Migrator(client[self.name], DEFAULT_PREFIX, say=lambda line: None)
                return await (m.up(SCHEMA_VERSION if to is None else to) if direction == "up" else m.down(to))
            finally:
                await client.close()

        return asyncio.run(run())

    def indexes(self) -> set[str]:
        return {ix["name"] for ix in self.exes.list_indexes()}

    def layout(self) -> int:
        marker = self.counters.find_one({"_id": SCHEMA_MARKER_ID})
        assert marker is not None
        return int(marker["n"])

    def documents(self) -> list[dict[str, Any]]:
        return list(self.exes.find().sort("_id", 1))


@pytest.fixture
def db(client: pymongo.MongoClient[Any], mongo_url: str, db_name: str) -> Iterator[Db]:
    """Executions holding outbox entries and spawns, written by this store at layout 4."""
    store = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    for i in range(6):
        exe = Execution(id=f"x{i}", definition_id="d")
        store.commit(exe, [])
        store.commit(exe, [(None, Event(kind="Hi", id=f"x{i}-hi"))], spawns=((f"x{i}:Fork.A:1", "Fork.A", {}),))
    store.close()
    yield Db(client, mongo_url, db_name)


def _relayed(db: Db) -> tuple[set[str], set[str]]:
    store = MongoStore(pymongo.MongoClient(db.url), db.name)
    try:
        return {e.event.id for e in store.pending_outbox()}, {s.child_id for s in store.pending_spawns()}
    finally:
        store.close()


def test_down_then_up_changes_only_the_index(db: Db) -> None:
    assert db.layout() == 4 and not DROPPED & db.indexes() and DECLARED <= db.indexes()
    written = db.documents()
    expected = ({f"x{i}-hi" for i in range(6)}, {f"x{i}:Fork.A:1" for i in range(6)})

    [down] = db.migrate("down", to=3)
    assert (down.version, down.direction, down.read, down.updated) == (4, "down", 0, 0)
    assert db.layout() == 3 and DROPPED <= db.indexes() and DECLARED <= db.indexes()
    assert db.documents() == written
    # a store of this version runs on layout 3 (it leaves the layout as it found it)
    assert _relayed(db) == expected and db.layout() == 3

    [up] = db.migrate("up")
    assert (up.version, up.direction, up.read, up.updated) == (4, "up", 0, 0)
    assert db.layout() == 4 and not DROPPED & db.indexes() and DECLARED <= db.indexes()
    assert db.documents() == written
    assert _relayed(db) == expected
    assert db.migrate("up") == []  # at 4: nothing to do


def test_an_up_stopped_after_the_drop_finishes_when_run_again(db: Db) -> None:
    """Killed between dropping the index and recording 4: the progress record says step 4 is
    half-way; running up again drops nothing more and records 4."""
    db.migrate("down", to=3)
    for name in DROPPED:
        db.exes.drop_index(name)
    db.counters.insert_one({"_id": PROGRESS_ID, "step": 4, "direction": "up", "after": None})
    [up] = db.migrate("up")
    assert up.version == 4 and db.layout() == 4 and not DROPPED & db.indexes()
    assert db.counters.find_one({"_id": PROGRESS_ID}) is None


def test_a_store_refuses_a_layout_it_cannot_run_on(db: Db) -> None:
    """Layout 3 and 2 are live migrations for this version; 1 is not."""
    from harel_beanie.core.errors import SchemaMismatch

    db.counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": 1}})
    with pytest.raises(SchemaMismatch):
        _relayed(db)


def test_up_at_this_layout_creates_the_declared_indexes_a_database_lacks(db: Db) -> None:
    """A database at this layout without the oldest holders' indexes (added with no layout
    change; a deployment whose stores run with `create_schema=False` never creates them):
    `migrate up` runs no step and creates them, with the declared partial filters, so the
    relay's reads keep their plan (tests/store/test_structure.py)."""
    added = {"hb_outbox_oldest", "hb_spawn_oldest"}
    for name in added:
        db.exes.drop_index(name)
    written = db.documents()
    assert db.migrate("up") == [] and db.layout() == SCHEMA_VERSION
    info = db.exes.index_information()
    declared = {ix.document["name"]: ix.document for ix in index_models(ExecutionDocument)}
    assert added <= set(info) and DECLARED <= set(info)
    for name in added:
        assert info[name]["partialFilterExpression"] == declared[name]["partialFilterExpression"], info[name]
    assert db.documents() == written
