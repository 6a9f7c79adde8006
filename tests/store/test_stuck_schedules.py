"""The stuck set under every interleaving: timers armed, cancelled, coming due, fired by the
sweep and their bounds repaired, racing commits and folds, run one call at a time in every
order up to a bound (tests/support/explore.py), with a kill after any step. After every step
the stuck list the views compute equals the one the documented definition gives from the
documents (tests/support/stuck_oracle.py, written apart from `core.stuck`), and the counts'
invariants hold; a schedule run to its end without a kill has done its work.

Each family (tests/support/stuck_families.py) names its actors and its start state; `FAMILIES`
bounds what the default run tries; `make soak` runs each deeper.
tests/store/test_stuck_mutations.py plants the faults these must catch.
"""

from __future__ import annotations

from typing import Callable

import pytest

from tests.support.explore import Actor
from tests.support.stuck_families import (
    StuckWorld,
    arm_then_cancel,
    cancel_and_folds,
    fire_and_cancel,
    overdue_and_rearm,
)

Family = Callable[[StuckWorld], list[Actor]]

#: family -> the bounds its default run explores: (preemptions, kills, most schedules)
FAMILIES: dict[Family, tuple[int, int, int]] = {
    cancel_and_folds: (1, 1, 12),
    arm_then_cancel: (1, 1, 12),
    fire_and_cancel: (2, 1, 12),
    overdue_and_rearm: (1, 1, 10),
}


@pytest.mark.parametrize("family", list(FAMILIES), ids=lambda f: f.__name__)
def test_every_schedule_of_the_family_keeps_the_stuck_set(stuck_world: StuckWorld, family: Family) -> None:
    preemptions, kills, limit = FAMILIES[family]
    report = stuck_world.explore(family(stuck_world), preemptions=preemptions, kills=kills, limit=limit, sample=2)
    assert not report.failures, str(report.failures[0])
    assert report.schedules > 1


@pytest.mark.soak
@pytest.mark.parametrize("family", list(FAMILIES), ids=lambda f: f.__name__)
def test_every_schedule_of_the_family_keeps_the_stuck_set_deeper(stuck_world: StuckWorld, family: Family) -> None:
    """The soak's budget: one more preemption, twenty times the schedules, and 400 random
    ones beyond them."""
    preemptions, kills, limit = FAMILIES[family]
    report = stuck_world.explore(
        family(stuck_world), preemptions=preemptions + 1, kills=kills, limit=20 * limit, sample=400
    )
    assert not report.failures, str(report.failures[0])
