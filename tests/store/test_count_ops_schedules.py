"""The counts and the archive under the operations the docs give, in every interleaving up
to a bound (tests/support/count_ops_families.py): a counters collection dropped and built
again while a fold runs, two prunes of one batch, a purge inside a removal, a prune taking
over a stalled one's marks, and the fold's recoveries beside prune's own fold; the counts'
invariants after every step, the archive (each removal once, nothing else) and each
prune's report (only what it removed) at the end, and progress where no actor was killed.
"""

from __future__ import annotations

from typing import Callable

import pytest

from tests.support.count_families import World
from tests.support.count_ops_families import OPS_FAMILIES, explore
from tests.support.explore import Actor

Family = Callable[[World], tuple[list[Actor], Callable[[], None]]]


@pytest.mark.parametrize("family", list(OPS_FAMILIES), ids=lambda f: f.__name__)
def test_every_schedule_of_the_operation_keeps_the_counts_and_the_archive(world: World, family: Family) -> None:
    preemptions, kills, limit = OPS_FAMILIES[family]
    actors, progress = family(world)
    report = explore(world, actors, progress, preemptions=preemptions, kills=kills, limit=limit, sample=5)
    assert not report.failures, str(report.failures[0])
    assert report.schedules > 1
    print(f"{family.__name__}: {report.schedules} schedules, exhausted {report.exhausted}")


@pytest.mark.soak
@pytest.mark.parametrize("family", list(OPS_FAMILIES), ids=lambda f: f.__name__)
def test_every_schedule_of_the_operation_deeper(world: World, family: Family) -> None:
    """The soak's budget: one more preemption and a kill everywhere, fifty times the
    schedules, 300 random."""
    preemptions, kills, limit = OPS_FAMILIES[family]
    actors, progress = family(world)
    report = explore(world, actors, progress, preemptions=preemptions + 1, kills=1, limit=50 * limit, sample=300)
    assert not report.failures, str(report.failures[0])
