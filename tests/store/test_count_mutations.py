"""Each guard of the counts planted away, one at a time: the schedule explorer (or the fixed
schedule it found) must fail, printing the schedule. A guard whose removal no test notices is
a guard nobody proved; these keep tests/store/test_count_schedules.py honest.

Each planted fault is a source edit of the function that keeps the guard
(tests/support/mutation.py): the day that code changes, the edit stops applying and says so.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import ModuleType
from typing import Any, Callable, Iterator

import pytest

from harel_beanie.core import commit, counting
from harel_beanie.core.flows import counting as counting_flows
from harel_beanie.retention import archive
from harel_beanie.retention import removal as removal_module
from tests.store.test_count_schedules import test_a_late_mark_does_not_land_on_an_id_created_again as late_mark
from tests.store.test_count_schedules import test_the_race_schedule_itself as race_schedule
from tests.support.count_families import (
    World,
    folds_and_a_commit,
    race,
    reader_and_folds,
    stalled_folder,
    state_only_and_prune,
    state_only_commits,
    two_builders,
)
from tests.support.count_ops_families import purge_inside_removal
from tests.support.explore import Actor
from tests.support.mutation import mutated

Family = Callable[[World], list[Actor]]

#: name -> (module, function, source as it is, source with the guard removed, the family
#: that must catch it, the bounds it is caught within, and the start of the invariant's
#: message it must break: an incidental assert, or an actor's crash, would not prove the guard)
EXPLORED: dict[str, tuple[ModuleType, str, str, str, Family, dict[str, Any], str]] = {
    # two folders both apply a batch read at the same seq: every document counted twice
    "the counter's seq condition": (
        counting_flows,
        "_fold_batch",
        'UpdateOne("counts", {"_id": part, "seq": seq}, update)',
        'UpdateOne("counts", {"_id": part}, update)',
        folds_and_a_commit,
        dict(preemptions=1, kills=0),
        "the counts by Rule 4 are",
    ),
    # a folder's late mark undoes a later batch's: a clean document counted as it was (the
    # marks one at a time, where the batch's bulk write missed: a late folder's misses)
    "the cseq guard on marks": (
        counting_flows,
        "_mark_each",
        'COUNTED_SEQ: {"$not": {"$gte": seq}}}',
        "}",
        stalled_folder,
        dict(preemptions=2, kills=0),
        "is marked",
    ),
    # a fold between the reader's two reads: its documents counted in both, or in neither
    "read_counts' second read of the seqs": (
        counting_flows,
        "read_counts",
        "if _pins(again) == _pins(counters):",
        "if True:",
        reader_and_folds,
        dict(preemptions=1, kills=0),
        "read_counts answered",
    ),
    # two builders both add a batch read at the same cursor: its documents counted twice
    "the build's cursor condition": (
        counting_flows,
        "_build_batch",
        'yield UpdateOne("counts", {"_id": part, "built": False, "seq": bases_of(counters, part), **at}, update)',
        'yield UpdateOne("counts", {"_id": part, "built": False, "seq": bases_of(counters, part)}, update)',
        two_builders,
        dict(preemptions=2, kills=0),
        "unbuilt counter",
    ),
    # the race of #38: deleted while a batch not yet marked on it counts it (the condition
    # less its clean term is da388e1's delete; its `cseq` term was redundant, Rule 5)
    "Rule 5's clean term (da388e1's delete)": (
        counting,
        "removable",
        'return {LEAVING: True, DIRTY: {"$exists": False}, COUNTED: None}',
        "return {LEAVING: True, COUNTED: None}",
        race,
        dict(preemptions=3, kills=0),
        "the counts by Rule 4 are",
    ),
    # prune's read-back: what it archives as removed is what is gone, by incarnation (a
    # removal whose own deletes removed nothing claims nothing, so the batch holds two: one
    # removed, one purged meanwhile)
    "the archive's incarnation check": (
        archive,
        "gone_among",
        "return [not still(d) for d in docs]",
        "return [True for d in docs]",
        lambda w: purge_inside_removal(w)[0],
        dict(preemptions=2, kills=0),
        "archived {",
    ),
    # a commit described as keeping its status, which moves it, lands unmarked: the
    # counters keep counting it as it was (Rule 2's pin on the stored status)
    "a pinned commit's status pin": (
        commit,
        "_pin",
        "cas.update(status=point(exe.status.value), definition_id=point(exe.definition_id))",
        "pass",
        state_only_and_prune,
        dict(preemptions=0, kills=0),
        "the counts by Rule 4 are",
    ),
    # a pinned commit sets `quiet` on a document whose timer bound it did not pin: a
    # RUNNING execution waiting on a timer listed among the silent ones (core.stuck)
    "a pinned commit's quiet pins": (
        commit,
        "_pin",
        'cas.update(pending={"$exists": False}, next_fire={"$exists": False})',
        "pass",
        state_only_commits,
        dict(preemptions=0, kills=0),
        "has quiet",
    ),
}


#: where a guard matters only once prune's re-folds are raced out (`FOLD_TRIES` folds each
#: beaten by another folder: the document is still dirty at the delete), that exhaustion is
#: planted beside it; the families race one folder, which a second fold always outlasts
RACED_OUT = (removal_module, "fold_leaving", "for _ in range(FOLD_TRIES):", "for _ in range(1):")
ALSO: dict[str, tuple[ModuleType, str, str, str]] = {"Rule 5's clean term (da388e1's delete)": RACED_OUT}


@pytest.mark.parametrize("name", list(EXPLORED))
def test_the_explorer_catches_the_guard_removed(world: World, name: str) -> None:
    module, function, old, new, family, bounds, message = EXPLORED[name]
    actors = family(world)
    with mutated(module, function, old, new), _also(name):
        # with prune's re-folds raced out on purpose (`ALSO`), only safety can hold
        report = world.explore(actors, progress=name not in ALSO, limit=3000, sample=0, max_failures=1, **bounds)
    assert report.failures, f"no schedule of {family.__name__} caught {name} removed ({report.schedules} tried)"
    caught = report.failures[0]
    print(f"{name} removed: {report.schedules} schedules until\n{caught}")
    assert message in caught.reason, f"{name} removed broke another check than its own: {caught.reason}"


#: the fixed schedules kept as regression tests, the guard each one holds, and the start of
#: the invariant's message it breaks
FIXED: dict[str, tuple[ModuleType, str, str, str, Callable[[World], None], str]] = {
    "Rule 5's clean term (da388e1's delete)": (
        counting,
        "removable",
        'return {LEAVING: True, DIRTY: {"$exists": False}, COUNTED: None}',
        "return {LEAVING: True, COUNTED: None}",
        race_schedule,
        "the counts by Rule 4 are",
    ),
    # prune folds its batch again while a racing folder's batch leaves it dirty: folded
    # once only, a removal beaten by one fold keeps what it could have removed (nothing
    # unsafe: the progress check's own message)
    "prune's re-folds": (
        removal_module,
        "fold_leaving",
        "for _ in range(FOLD_TRIES):",
        "for _ in range(1):",
        race_schedule,
        "no progress",
    ),
    "Rule 3's lineage on a late mark": (
        counting,
        "lineage",
        '    if "at" in entry:\n        first = {"tomb.at": entry["at"]}',
        '    return [{}]\n    if "at" in entry:\n        first = {"tomb.at": entry["at"]}',
        late_mark,
        "the counts by Rule 4 are",
    ),
}


@pytest.mark.parametrize("name", list(FIXED))
def test_the_fixed_schedule_catches_the_guard_removed(world: World, name: str) -> None:
    module, function, old, new, test, message = FIXED[name]
    with mutated(module, function, old, new), _also(name), pytest.raises(AssertionError, match=message) as caught:
        test(world)
    print(f"{name} removed: {caught.value}")


@contextmanager
def _also(name: str) -> Iterator[None]:
    """The fault planted beside `name`'s (`ALSO`), if any."""
    if name not in ALSO:
        yield
        return
    with mutated(*ALSO[name]):
        yield
