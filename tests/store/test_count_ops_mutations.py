"""Each guard the documented operations rely on planted away, one at a time
(tests/support/mutation.py): a family of tests/support/count_ops_families.py must fail, and
with the invariant's own message, not any AssertionError (an incidental assert, or an actor's
crash, would not prove the guard).

Two of these are faults the first families explored past: `_fold_batch`'s recovery of a
batch its folder applied and did not mark (caught by a fold over two documents beside
prune's fold of one of them), and `lineage`'s `tomb.buried` form (caught by a fold, a purge
of one of its documents and a prune of another; the older planted-fault test replaced the
whole function, so it could not tell the forms apart).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

import pytest

from harel_beanie.core import counting
from harel_beanie.core.flows import counting as counting_flows
from harel_beanie.retention import archive, removal
from tests.support.count_families import World
from tests.support.count_ops_families import (
    a_late_removal,
    explore,
    fold_beside_prune,
    fold_purge_prune,
    purge_inside_removal,
    rebuild_racing_fold,
    two_removals,
)
from tests.support.explore import Actor
from tests.support.mutation import mutated

Family = Callable[[World], tuple[list[Actor], Callable[[], None]]]

#: name -> (module, function, source as it is, source with the guard removed, the family
#: that must catch it, its bounds, and the start of the invariant's message it must break)
PLANTED: dict[str, tuple[ModuleType, str, str, str, Family, dict[str, Any], str]] = {
    # Rule 3: a fold that finds `last` unmarked marks it before its own batch replaces it
    "_fold_batch's recovery of an unmarked batch": (
        counting_flows,
        "_fold_batch",
        'yield from _mark(part, seq, counter["last"])',
        "pass",
        fold_beside_prune,
        dict(preemptions=1, kills=1),
        "the counts by Rule 4 are",
    ),
    # Rule 3: a late mark lands on the tombstone that buried the incarnation read
    "lineage's tomb.buried form": (
        counting,
        "lineage",
        'return [first, {"buried": token}, {"tomb.buried": token}]',
        'return [first, {"buried": token}]',
        fold_purge_prune,
        dict(preemptions=1, kills=0),
        "the counts by Rule 4 are",
    ),
    # Rule 6: the build raises older marks to its epoch before it sums them
    "Rule 6's raise of older marks": (
        counting_flows,
        "_build_batch",
        "if max(bases.values()):",
        "if False:",
        rebuild_racing_fold,
        dict(preemptions=2, kills=0),
        "the counts by Rule 4 are",
    ),
    # Rule 6: a counter built anew starts at a new epoch's base, not at 0
    "Rule 6's epoch base": (
        counting_flows,
        "fresh_counters",
        'base = epoch_base(int((epoch or {}).get("n") or 1))',
        "base = 0",
        rebuild_racing_fold,
        dict(preemptions=1, kills=0),
        "still dirty after a settling fold",
    ),
    # a removal's leaving mark holds off another removal for `LEASE`
    "a removal's lease on its marks": (
        removal,
        "claim",
        "return None if held else {LEAVER: token}",
        "return {LEAVER: token}",
        two_removals,
        dict(preemptions=2, kills=0),
        "archived {",
    ),
    # a removal that deleted nothing claims nothing, whatever went meanwhile
    "a removal claims only where its own delete landed": (
        removal,
        "remove_held",
        "return gone if deleted else []",
        "return gone",
        a_late_removal,
        dict(preemptions=2, kills=0),
        "archived {",
    ),
    # a tombstone burying the incarnation read is a purge, not a removal to archive
    "a purge is no removal": (
        archive,
        "gone_among",
        'if born and born in [*((p.get("tomb") or {}).get("buried") or ()), *(p.get("buried") or ())]:',
        "if False:",
        purge_inside_removal,
        dict(preemptions=2, kills=0),
        "archived {",
    ),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_the_operation_families_catch_the_guard_removed(world: World, name: str) -> None:
    module, function, old, new, family, bounds, message = PLANTED[name]
    actors, progress = family(world)
    with mutated(module, function, old, new):
        report = explore(world, actors, progress, limit=600, max_failures=1, **bounds)
    assert report.failures, f"no schedule of {family.__name__} caught {name} removed ({report.schedules} tried)"
    reason = report.failures[0].reason
    print(f"{name} removed: {report.schedules} schedules until\n{report.failures[0]}")
    assert message in reason, f"{name} removed broke another check than its own: {reason}"
