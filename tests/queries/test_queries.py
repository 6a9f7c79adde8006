"""The dashboard queries (harel_beanie.queries) return what the store holds, each through
its index (checked with explain), and `backlog()` reports a backlog that is really there."""

from __future__ import annotations

from typing import Any

import pytest
from harel.engine.execution import Execution, Status
from harel.engine.store.base import TimerOp
from harel.spec.states import Event

from harel_beanie import queries
from harel_beanie.core.documents import ExecutionDocument

NOW = 1_800_000_000.0


def winning_index(plan: dict[str, Any]) -> set[str]:
    names, stack = set(), [plan["queryPlanner"]["winningPlan"]]
    while stack:
        node = stack.pop()
        if node.get("stage") == "IXSCAN":
            names.add(node["indexName"])
        stack += [node[k] for k in ("inputStage", "queryPlan") if k in node] + node.get("inputStages", [])
    return names


async def explain(q: Any) -> dict[str, Any]:
    coll = ExecutionDocument.get_pymongo_collection()
    cursor = coll.find(q.get_filter_query())
    if q.sort_expressions:
        cursor = cursor.sort(q.sort_expressions)
    return await cursor.explain()


async def seed(astore) -> None:
    def exe(i: str, status: Status, updated: float, parent: str | None = None) -> Execution:
        return Execution(id=i, definition_id="order", status=status, updated_at=updated, parent_id=parent)

    await astore.save(exe("f-old", Status.FAILED, NOW - 7200))
    await astore.save(exe("f-new", Status.FAILED, NOW - 60))
    await astore.save(exe("f-mid", Status.FAILED, NOW - 1800))
    await astore.save(exe("r-silent", Status.RUNNING, NOW - 3600))
    await astore.save(exe("r-busy", Status.RUNNING, NOW - 5))
    await astore.save(exe("r-busy:A:0", Status.RUNNING, NOW - 5, parent="r-busy"))
    await astore.save(exe("r-busy:B:0", Status.DONE, NOW - 5, parent="r-busy"))
    waiting = exe("w", Status.RUNNING, NOW - 5)
    await astore.commit(waiting, [("r-busy", Event(kind="Ping"))], timers=(TimerOp("schedule", "Pay.Wait", NOW + 30),))
    late = exe("late", Status.RUNNING, NOW - 5)
    await astore.commit(late, [], timers=(TimerOp("schedule", "T", NOW - 10),), spawns=(("late:X:0", "X", {}),))


async def test_each_dashboard_query_answers_through_its_index(astore):
    await seed(astore)
    cases = [
        (queries.failed_since(NOW - 3600), ["f-new", "f-mid"], "hb_status_updated"),
        (queries.stuck_running(600, now=NOW), ["r-silent"], "hb_status_updated"),
        (queries.children_of("r-busy"), ["r-busy:A:0", "r-busy:B:0"], "hb_parent"),
        (queries.waiting_on_timer(), ["late", "w"], "hb_timer_pending"),
        (queries.waiting_on_timer(before=NOW), ["late"], "hb_timer_pending"),
        (queries.by_status("FAILED"), ["f-mid", "f-new", "f-old"], "hb_status"),
    ]
    for q, ids, index in cases:
        assert [r.id for r in await q.to_list()] == ids
        assert index in winning_index(await explain(q)), (ids, index)
    rows = await queries.failed_since(NOW - 3600, definition_id="order").to_list()
    assert rows[0].status == "FAILED" and not hasattr(rows[0], "data")


async def test_backlog_reports_what_is_pending(astore):
    await seed(astore)
    b = await queries.backlog(now=NOW, stuck_after=600)
    assert b.counts["order"] == {"FAILED": 3, "RUNNING": 5, "DONE": 1}
    assert b.pending_outbox == 1 and b.pending_spawns == 1 and b.due_timers == 1
    assert b.oldest_outbox_age is not None  # the seq carries its mint time
    assert [(t["id"], t["path"]) for t in b.next_timers] == [("late", "T"), ("w", "Pay.Wait")]
    assert [s["id"] for s in b.stuck] == ["r-silent"]
    assert b.as_dict()["pending_outbox"] == 1
    await astore.ack_outbox((await astore.pending_outbox())[0].seq)
    assert (await queries.backlog(now=NOW)).pending_outbox == 0


@pytest.mark.parametrize("seq,expected", [(5, None), (0, None)])
def test_harels_small_seqs_carry_no_time(seq, expected):
    from harel_beanie.core.seqs import minted_at

    assert minted_at(seq) is expected
