"""The end-of-run check of the stuck list and the pending figures (tests/support/exact_waiting.py,
run inside `exact_counts` at both of its moments): every view agrees with the definitions on a
store with silent, waiting and finished executions; and it is not vacuous: a silent execution
whose timer bound a cancel left behind, and an outbox entry written without the `pending` flag,
are named by every view that shows them."""

from __future__ import annotations

import time
from typing import Any

from harel import Event
from harel.engine.execution import Execution, Status

from harel_beanie import AsyncMongoStore
from tests.support.exact_counts import exact_counts
from tests.support.exact_waiting import WAITING_MISMATCH

VIEWS = {"queries.backlog", "harel-beanie status --json", "dashboard /api/backlog", "dashboard /metrics"}
#: 2024-01-01 in ms, and the bits below a seq's millisecond (the pending oracle's seq layout)
_EPOCH_MS, _LOW_BITS = 1_704_067_200_000, 22
HOUR = 3600.0


async def _stored(store: AsyncMongoStore) -> None:
    """Silent RUNNING executions (stuck at a second's threshold), one holding an outbox entry
    and a spawn (waiting), finished ones (neither)."""
    old = time.time() - HOUR
    for i in range(4):
        await store.save(Execution(id=f"quiet-{i}", definition_id="Order", status=Status.RUNNING, updated_at=old))
    for i in range(2):
        await store.save(Execution(id=f"done-{i}", definition_id="Order", status=Status.DONE, updated_at=old))
    exe = Execution(id="waits", definition_id="Payment", status=Status.RUNNING, updated_at=old)
    await store.commit(exe, [])
    await store.commit(exe, [(None, Event(kind="Hi", id="waits-hi"))], spawns=(("waits:Fork.A:1", "Fork.A", {}),))
    await store.fold_counts()


def _named(problems: list[str], what: str) -> set[str]:
    return {v for v in VIEWS if any(WAITING_MISMATCH in p and f": {v}: " in p and what in p for p in problems)}


async def test_every_view_agrees_with_the_definitions(astore: AsyncMongoStore, mongo_url: str) -> None:
    await _stored(astore)
    check = await exact_counts(astore, mongo_url)
    assert not check.problems, "\n".join(check.problems)


async def test_a_stale_bound_and_an_unflagged_entry_are_named_by_every_view(
    astore: AsyncMongoStore, mongo_url: str, client: Any, db_name: str
) -> None:
    """`quiet-0`'s document as a cancel that left its week-long timer's bound would leave it
    (no timer, `next_fire` a week ahead, no `quiet`): the definition makes it stuck, and no
    view reading through the bound and `quiet` lists it. `done-0` given an outbox entry with
    no `pending` flag: the documents hold one entry more than any view counts, and its holder
    is missing from the lists of the oldest."""
    await _stored(astore)
    exes = client[db_name]["harel_executions"]
    hid = exes.update_one(
        {"_id": "quiet-0"}, {"$set": {"next_fire": time.time() + 7 * 24 * HOUR}, "$unset": {"quiet": ""}}
    )
    seq = (int((time.time() - HOUR) * 1000) - _EPOCH_MS) << _LOW_BITS  # older than `waits`' entry
    unflagged = exes.update_one({"_id": "done-0"}, {"$push": {"outbox": {"seq": seq}}})
    assert hid.modified_count == unflagged.modified_count == 1
    check = await exact_counts(astore, mongo_url)
    # the lists name it missing; /metrics, which counts them, counts one fewer
    assert _named(check.problems, "(missing ['quiet-0'])") == VIEWS - {"dashboard /metrics"}, check.problems
    assert _named(check.problems, "counts 3 stuck, the documents 4") == {"dashboard /metrics"}, check.problems
    assert _named(check.problems, "pending outbox entries, the documents hold 2") == VIEWS, check.problems
    holders = "the oldest outbox entries held by ['waits'], the documents say ['done-0', 'waits']"
    assert _named(check.problems, holders) == VIEWS - {"dashboard /metrics"}, check.problems
