"""Prune in bulk (issue 39, item 4), counted on the wire: one batch of prune costs the same
round trips whatever it holds, on the real server. Its leaving marks are one bulk write, the
counts' fold of the batch one bulk write of marks per partition (it was a round trip per
execution: `core.flows.counting._mark`), its deletes one bulk write, and its archive records
appended once (the journal and the copy each one write for the batch).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pymongo
import pytest
from harel.engine.execution import Execution, Status

from harel_beanie import MongoStore, retention
from harel_beanie.core.partitions import DEFAULT_PARTITIONS
from harel_beanie.retention.archive import CollectionArchive
from tests.support.wire import Recorder

NOW = 1_800_000_000.0
OLD = NOW - 40 * 86400
CUT = NOW - 30 * 86400


def seeded(mongo_url: str, name: str, n: int) -> None:
    """`n` executions DONE long ago, folded (their counters built and clean)."""
    st = MongoStore(pymongo.MongoClient(mongo_url), name)
    try:
        st.init()
        for i in range(n):
            st.save(
                Execution(id=f"p{i:04d}", definition_id="Order", status=Status.DONE, updated_at=OLD, finished_at=OLD)
            )
        st.fold_counts()
    finally:
        st.close()


async def one_batch(mongo_url: str, name: str, size: int) -> tuple[Counter[tuple[str, str]], int]:
    """The commands of prune's first batch of `size`, by (command, collection), and how many
    it removed."""
    rec = Recorder()
    watched: Any = pymongo.AsyncMongoClient(mongo_url, event_listeners=[rec])
    try:
        db = watched[name]
        report = await retention.prune(
            db.harel_executions, CUT, batch_size=size, archive=CollectionArchive(db, "pruned"), stop_after_batches=1
        )
    finally:
        await watched.close()
    # a getMore is the rest of a read's documents (a window of 144 is past a first batch of
    # 101), not a round trip the batch's size adds per execution
    return Counter((c, str(body.get(c))) for c, body in rec.commands if c != "getMore"), report.removed


@pytest.fixture
def names(client: Any, db_name: str) -> Any:
    made: list[str] = []
    yield made
    for name in made:
        client.drop_database(name)


async def test_a_batch_of_prune_costs_the_same_round_trips_whatever_it_holds(
    mongo_url: str, client: Any, db_name: str, names: list[str]
) -> None:
    """A batch of 48 and one of 144, each over every partition: the same commands, by name
    and collection; the executions get one bulk write of marks, one of deletes and one per
    partition folded (the fold's marks), never one per execution."""
    seen = []
    for size in (48, 144):
        name = f"{db_name}_{size}"
        names.append(name)
        seeded(mongo_url, name, size)
        parts = len({d["part"] for d in client[name].harel_executions.find({}, {"part": 1})})
        assert parts == DEFAULT_PARTITIONS  # the batch spans every partition
        commands, removed = await one_batch(mongo_url, name, size)
        assert removed == size and client[name].harel_executions.count_documents({}) == 0
        seen.append(commands)
        # the leaving marks, then per partition the fold's marks (its counter's own updates
        # go to the counts collection)
        assert commands[("update", "harel_executions")] == 1 + parts, commands
        assert commands[("delete", "harel_executions")] == 1, commands
        # the archive: the journal written once and cleared once, the copy written once
        assert commands[("insert", "pruned_pending")] == 1, commands
        assert commands[("update", "pruned")] + commands[("insert", "pruned")] == 1, commands
        assert len(list(client[name].pruned.find({}))) == size
    assert seen[0] == seen[1], (seen[0] - seen[1], seen[1] - seen[0])
