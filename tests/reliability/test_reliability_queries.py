"""The dashboard queries (`harel_beanie.queries`) refuse a value of the wrong type, an
operator-shaped dict above all, with a clear error naming the argument, before any query is
built: a value taken from a request never reaches a filter as a query operator.

Each operator case is also run as the raw filter the query would have sent, to show what it
would have matched: more than the honest query does.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
from harel.engine.execution import Execution, Status
from harel.engine.store.base import TimerOp

from harel_beanie import bind, queries
from harel_beanie.core.documents import ExecutionDocument
from tests.support.figures import Figures

NOW = 1_800_000_000.0

OPS: list[Any] = [
    {"$ne": None},
    {"$gt": ""},
    {"$exists": True},
    {"$regex": ".*"},
    {"$in": ["a", "b"]},
    ["a"],
    {"$where": "1"},
]
NOT_NUMBERS: list[Any] = [*OPS, "1", b"1", None, True, math.nan]
NOT_STRS: list[Any] = [*OPS, 1, 1.5, b"x", True, "lone \ud800"]

#: (query, argument name, a call passing `value` as that argument)
CALLS: list[tuple[str, str, Callable[[Any], Any], list[Any]]] = [
    ("failed_since", "since", lambda v: queries.failed_since(v), NOT_NUMBERS),
    ("failed_since", "definition_id", lambda v: queries.failed_since(0.0, definition_id=v), [x for x in NOT_STRS]),
    ("failed_since", "doc", lambda v: queries.failed_since(0.0, doc=v), [*OPS, "harel_executions", dict]),
    ("stuck_running", "older_than", lambda v: queries.stuck_running(v), [*NOT_NUMBERS, -1.0, math.inf]),
    ("stuck_running", "now", lambda v: queries.stuck_running(60, now=v), [x for x in NOT_NUMBERS if x is not None]),
    ("children_of", "parent_id", lambda v: queries.children_of(v), [*NOT_STRS, None]),
    (
        "waiting_on_timer",
        "before",
        lambda v: queries.waiting_on_timer(before=v),
        [x for x in NOT_NUMBERS if x is not None],
    ),
    ("by_status", "status", lambda v: queries.by_status(v), [*NOT_STRS, None, "FAILD", "failed"]),
    ("by_status", "doc", lambda v: queries.by_status("FAILED", doc=v), [*OPS, None]),
]
CASES = [
    pytest.param(call, name, value, id=f"{q}-{name}-{value!r}") for q, name, call, values in CALLS for value in values
]

BACKLOG: list[tuple[str, dict[str, Any]]] = [
    *[("stuck_after", {"stuck_after": v}) for v in [*NOT_NUMBERS, -5.0] if v is not None],
    *[("now", {"now": v}) for v in NOT_NUMBERS if v is not None],
    *[("show", {"show": v}) for v in [*OPS, 1.5, "3", True, -1]],
    *[("doc", {"doc": v}) for v in [*OPS, "harel_executions"]],
]


async def seed(astore: Any) -> None:
    def exe(i: str, status: Status, parent: str | None = None) -> Execution:
        return Execution(id=i, definition_id="order", status=status, updated_at=NOW - 3600, parent_id=parent)

    await astore.save(exe("f", Status.FAILED))
    await astore.save(exe("r", Status.RUNNING))
    await astore.save(exe("r:A:0", Status.RUNNING, parent="r"))
    await astore.save(exe("other:A:0", Status.DONE, parent="other"))
    await astore.commit(exe("t", Status.RUNNING), [], timers=(TimerOp("schedule", "T", NOW + 60),))


@pytest.mark.parametrize("call,name,value", CASES)
def test_a_query_argument_of_the_wrong_type_is_refused_naming_it(
    call: Callable[[Any], Any], name: str, value: Any
) -> None:
    """Every public query, every argument: a dict, a list, a bool, bytes, a NaN, a
    negative duration, a lone surrogate, a misspelt status: TypeError or ValueError,
    whose message names the argument, raised when the query is built (nothing is sent)."""
    with pytest.raises((TypeError, ValueError)) as err:
        call(value)
    assert name in str(err.value)


@pytest.mark.parametrize("name,kwargs", [pytest.param(n, kw, id=f"{n}-{kw[n]!r}") for n, kw in BACKLOG])
async def test_backlog_refuses_arguments_of_the_wrong_type(astore: Any, name: str, kwargs: dict[str, Any]) -> None:
    """`backlog()` likewise: a duration, a time, a row count or a document class of the
    wrong type or out of range is refused naming the argument, before any command."""
    await astore.init()
    with pytest.raises((TypeError, ValueError)) as err:
        await queries.backlog(**kwargs)
    assert name in str(err.value)


async def test_operator_values_would_have_matched_and_are_refused(astore: Any, figures: Figures) -> None:
    """What an operator would have done had it reached the filter (run here as the raw
    filter the old code built): `children_of({"$ne": None})` lists every child of every
    execution, `by_status({"$ne": None})` every execution, a definition id `{"$ne": None}`
    every definition. Each is refused now, and the honest queries still answer."""
    await seed(astore)
    coll = ExecutionDocument.get_pymongo_collection()
    leaks = [
        (lambda: queries.children_of({"$ne": None}), {"parent_id": {"$ne": None}}, ["other:A:0", "r:A:0"]),
        (lambda: queries.by_status({"$ne": None}), {"status": {"$ne": None}}, ["f", "other:A:0", "r", "r:A:0", "t"]),
        (
            lambda: queries.failed_since(0.0, definition_id={"$ne": None}),
            {"status": "FAILED", "definition_id": {"$ne": None}},
            ["f"],
        ),
        (lambda: queries.stuck_running(60, now={"$ne": None}), None, None),
    ]
    for refused, raw, matched in leaks:
        if raw is not None:
            assert sorted([d["_id"] async for d in coll.find(raw)]) == matched  # what it would have leaked
        with pytest.raises((TypeError, ValueError)):
            refused()
    assert [r.id for r in await queries.children_of("r").to_list()] == ["r:A:0"]
    assert [r.id for r in await queries.by_status(Status.FAILED).to_list()] == ["f"]
    assert [r.id for r in await queries.by_status("RUNNING").to_list()] == ["r", "r:A:0", "t"]
    assert [r.id for r in await queries.waiting_on_timer(before=math.inf).to_list()] == ["t"]
    assert [r.id for r in await queries.stuck_running(60, now=NOW).to_list()] == ["r", "r:A:0", "t"]
    assert [r.id for r in await queries.failed_since(NOW - 7200, definition_id="order", doc=bind()[0]).to_list()] == [
        "f"
    ]
    assert (await queries.backlog(now=NOW, stuck_after=0, show=0)).stuck == []
    figures.add(operator_cases=len(leaks))
