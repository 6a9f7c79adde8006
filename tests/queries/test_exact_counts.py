"""The end-of-run count check (tests/support/exact_counts.py) on a store with executions in
several statuses and definitions, a commit, a purge and a creation over its tombstone: every
source agrees with the documents; and it is not vacuous: a counter moved by hand, or an
execution written behind the store's back, is named by every source that shows it."""

from __future__ import annotations

import time
from typing import Any

import pytest
from harel.engine.execution import Execution, Status

from harel_beanie import AsyncMongoStore
from harel_beanie.core.count_documents import counts_collection
from harel_beanie.core.counting import definition_key, status_key
from tests.support import exact_counts as exact
from tests.support.exact_counts import exact_counts

SOURCES = {
    "execution_counts()",
    "status_counts()",
    "dashboard /api/backlog",
    "dashboard /api/executions",
    "dashboard /metrics",
    "harel-beanie status --json",
}


async def _stored(store: AsyncMongoStore) -> None:
    """Seven executions over two definitions and three statuses; one committed once more,
    one purged (its tombstone stays), one purged and created again over its tombstone."""
    now = time.time()
    for i in range(7):
        status = (Status.DONE, Status.FAILED, Status.RUNNING)[i % 3]
        exe = Execution(id=f"x-{i}", definition_id=("Payment", "Order")[i % 2], status=status, updated_at=now)
        await store.save(exe)
    exe = await store.load("x-2")
    assert exe is not None
    await store.commit(exe, [])
    for gone in ("x-5", "x-6"):
        found = await store.load(gone)
        assert found is not None and await store.purge(gone, found.version)
    await store.save(Execution(id="x-6", definition_id="Order", status=Status.RUNNING, updated_at=now))


async def test_every_source_agrees_with_the_documents(astore: AsyncMongoStore, mongo_url: str) -> None:
    await _stored(astore)
    check = await exact_counts(astore, mongo_url)
    assert not check.problems, "\n".join(check.problems)
    assert set(check.sources) == SOURCES
    assert check.documents.per == {
        "Payment": {"DONE": 1, "RUNNING": 1, "FAILED": 1},
        "Order": {"FAILED": 1, "DONE": 1, "RUNNING": 1},
    }
    assert check.documents.purged == 1
    assert check.figures()["count_sources"] == len(SOURCES)


async def test_a_counter_moved_by_hand_is_named_by_every_source(
    astore: AsyncMongoStore, mongo_url: str, client: Any, db_name: str
) -> None:
    """One DONE Payment more in a partition's counter than the documents hold: every source
    reads the counters, so every one of them is named, before and after the final fold (a
    fold applies deltas, never a recount, so it stays wrong)."""
    await _stored(astore)
    await astore.fold_counts()
    moved = client[db_name][counts_collection("harel")].update_one(
        {"_id": astore.partitions.part_of("x-0")},
        {"$inc": {f"n.{definition_key('Payment')}.{status_key('DONE')}": 1}},
    )
    assert moved.modified_count == 1
    check = await exact_counts(astore, mongo_url)
    for when in ("as the run left them", "after a fold of every partition"):
        named = {name for name in SOURCES if any(p.startswith(f"{when}: {name} says") for p in check.problems)}
        assert named == SOURCES, (when, check.problems)
    assert any("'DONE': 3" in p and "'DONE': 2" in p for p in check.problems), check.problems


async def test_an_execution_written_behind_the_stores_back_is_named(
    astore: AsyncMongoStore, mongo_url: str, client: Any, db_name: str
) -> None:
    """A document inserted without the store (no dirty flag, so no fold ever counts it): the
    documents hold one RUNNING Payment more than any source says."""
    await _stored(astore)
    await astore.fold_counts()
    part = astore.partitions.part_of("ghost")
    client[db_name]["harel_executions"].insert_one(
        {"_id": "ghost", "part": part, "definition_id": "Payment", "status": "RUNNING", "version": 1}
    )
    check = await exact_counts(astore, mongo_url)
    assert check.documents.per is not None and check.documents.per["Payment"]["RUNNING"] == 2
    named = {name for name in SOURCES if any(f": {name} says" in p for p in check.problems)}
    assert named == SOURCES, check.problems


async def test_nothing_stored_or_a_source_that_cannot_answer_is_a_problem(
    astore: AsyncMongoStore, mongo_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing stored: the check says it proves nothing. A status command that exits with an
    error (here refused a prefix): named as failed, never left out of the comparison."""
    await astore.init()
    check = await exact_counts(astore, mongo_url)
    assert any("no execution stored" in p for p in check.problems), check.problems
    await _stored(astore)
    real = exact.status_says

    async def refused(url: str, db: str, prefix: str) -> Any:
        return await real(url, db, "$" + prefix)

    monkeypatch.setattr(exact, "status_says", refused)
    check = await exact_counts(astore, mongo_url)
    failed = [p for p in check.problems if "harel-beanie status failed" in p]
    assert len(failed) == 2 and "prefix" in failed[0], check.problems
