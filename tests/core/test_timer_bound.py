"""A commit's timer bound (`core.stuck`, Rule T1), with no server: the earliest of the timers
it leaves (the loaded ones, less its cancels, with its schedules), or none; read first when
the store's load left no hint; a conflict when that read finds another version than loaded.
The families in tests/store/test_stuck_schedules.py prove it against the views; these pin
the write itself."""

from __future__ import annotations

from typing import Any, Optional

import pytest
from harel.engine.store.base import StoreConflict, TimerOp

from harel_beanie.core import flows
from harel_beanie.core.calls import FindOne, UpdateOne
from harel_beanie.core.commit import CommitRequest, plan_commit
from tests.core.test_flows import ID, execution, on, run, state

W, V, U = 1_000.0, 2_000.0, 3_000.0


@pytest.mark.parametrize(
    "armed, ops, bound",
    [
        # the last timer cancelled: no bound at all, as if it had never been armed
        ({"w": W}, [TimerOp("cancel", "w")], None),
        # one of two cancelled: the other's time, raised from the cancelled one's
        ({"w": W, "v": V}, [TimerOp("cancel", "w")], V),
        # cancelled and another armed in the same step (a state left, another entered)
        ({"w": W}, [TimerOp("cancel", "w"), TimerOp("schedule", "u", U)], U),
        # armed beside an earlier one: the earlier stays the bound
        ({"w": W}, [TimerOp("schedule", "u", U)], W),
        # re-armed later: the new time
        ({"w": W}, [TimerOp("schedule", "w", U)], U),
    ],
)
def test_the_bound_is_the_earliest_timer_left(
    armed: dict[str, float], ops: list[TimerOp], bound: Optional[float]
) -> None:
    plan = plan_commit(CommitRequest(execution(), timers=ops), trace_max=10, dedupe_window=10, armed=armed)
    set_ops, unset_ops = plan.update["$set"], plan.update.get("$unset", {})
    assert "$min" not in plan.update
    if bound is None:
        assert "next_fire" in unset_ops and "next_fire" not in set_ops
    else:
        assert set_ops["next_fire"] == bound and "next_fire" not in unset_ops


def test_without_the_loaded_timers_a_schedule_lowers_the_bound_only() -> None:
    plan = plan_commit(CommitRequest(execution(), timers=[TimerOp("schedule", "u", U)]), trace_max=10, dedupe_window=10)
    assert plan.update["$min"] == {"next_fire": U} and "next_fire" not in plan.update["$set"]


def _unsets_bound(update: Any) -> bool:
    return "next_fire" in update.get("$unset", {}) and "$min" not in update


def test_a_commit_with_no_load_hint_reads_the_timers_first() -> None:
    st = state()
    request = CommitRequest(execution(version=3), timers=[TimerOp("cancel", "w")])
    run(
        flows.commit(st, request),
        (
            on(FindOne, "executions", filter={"_id": ID}, projection={"version": 1, "timers": 1}),
            {"_id": ID, "version": 3, "timers": {"w": W}},
        ),
        (on(UpdateOne, "executions", update=_unsets_bound), 1),
    )


def test_a_commit_over_a_load_hint_reads_nothing() -> None:
    st = state()
    st.loaded(ID, 3, False, True, {"w": W, "v": V})
    request = CommitRequest(execution(version=3), timers=[TimerOp("cancel", "w")])
    run(flows.commit(st, request), (on(UpdateOne, "executions", update=lambda u: u["$set"]["next_fire"] == V), 1))


@pytest.mark.parametrize("found", [2, 4])
def test_timers_read_at_another_version_are_a_conflict(found: int) -> None:
    """Above the version loaded the filter would refuse it anyway; below it, the loaded
    version is no past of the stored one's (the id created again): its timers say nothing."""
    request = CommitRequest(execution(version=3), timers=[TimerOp("cancel", "w")])
    with pytest.raises(StoreConflict):
        run(flows.commit(state(), request), (on(FindOne, "executions"), {"_id": ID, "version": found, "timers": {}}))
