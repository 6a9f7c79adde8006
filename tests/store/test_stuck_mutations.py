"""Each fault the stuck set's families must catch, planted one at a time: the explorer must
fail with the invariant that names it (the views' stuck list against the definition's,
tests/support/stuck_oracle.py; the progress check, tests/support/stuck_families.py),
printing the schedule, not with any other assertion.

Each planted fault is a source edit of the function that keeps the rule
(tests/support/mutation.py): the day that code changes, the edit stops applying and says so.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

import pytest

from harel_beanie.core import stuck, timer_ops
from harel_beanie.core.flows import relays
from tests.support.explore import Actor
from tests.support.mutation import mutated
from tests.support.stuck_families import LEFT_DUE, StuckWorld, cancel_and_folds, fire_and_cancel
from tests.support.stuck_oracle import STUCK_MISMATCH

Family = Callable[[StuckWorld], list[Actor]]

#: name -> (module, function, source as it is, source with the fault, the family that must
#: catch it, the bounds it is caught within, and the invariant's message)
PLANTED: dict[str, tuple[ModuleType, str, str, str, Family, dict[str, Any], str]] = {
    # a cancel leaves the cancelled timer's time as the bound (Rule T1 undone: `$min` on
    # schedule only): out of `hb_quiet` once folded, not due, so listed by no view for days
    "a cancel's stale bound": (
        timer_ops,
        "bound_update",
        "if timer_ops and left is not None:",
        "if False:",
        cancel_and_folds,
        dict(preemptions=0, kills=0),
        STUCK_MISMATCH,
    ),
    # silent for exactly the threshold counted as stuck ("longer than", docs/dashboard.md)
    "is_stuck's > as >=": (
        stuck,
        "is_stuck",
        "silent_for(doc, now) > after",
        "silent_for(doc, now) >= after",
        cancel_and_folds,
        dict(preemptions=0, kills=0),
        STUCK_MISMATCH,
    ),
    # a sweep that fires all but one of the due timers it read: nothing unsafe at any step
    # (a timer due for less than the threshold is waiting), only work not done
    "a sweep that leaves a due timer": (
        relays,
        "due_timers",
        "    return due\n",
        "    return due[1:]\n",
        fire_and_cancel,
        dict(preemptions=0, kills=0),
        LEFT_DUE,
    ),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_the_stuck_families_catch_the_fault(stuck_world: StuckWorld, name: str) -> None:
    module, function, old, new, family, bounds, message = PLANTED[name]
    actors = family(stuck_world)
    with mutated(module, function, old, new):
        report = stuck_world.explore(actors, limit=50, sample=0, max_failures=1, **bounds)
    assert report.failures, f"no schedule of {family.__name__} caught {name} ({report.schedules} tried)"
    caught = report.failures[0]
    assert message in caught.reason, f"{name} caught by another assertion: {caught}"
    print(f"{name}: {report.schedules} schedules until\n{caught}")
