"""The counts under every interleaving: folds, commits, purges, creations over tombstones,
prune's removal and re-creations after it, a counter's build in batches, run one call at a time in every order up to a
bound (tests/support/explore.py), with a kill after any step, the counts' invariants checked
after every step (tests/support/count_oracle.py), on the real wire server.

Each family (tests/support/count_families.py) names its actors and its start state; `FAMILIES`
bounds what the default run tries; `make soak` runs each deeper.
tests/store/test_count_mutations.py plants each guard's removal and shows these catch it.
"""

from __future__ import annotations

from typing import Callable

import pytest

from tests.support.count_families import (
    EXES,
    Actor,
    Runner,
    World,
    build_commit_and_fold,
    commit_reviving,
    done,
    folds_and_a_commit,
    follow,
    prune_and_recreation,
    purge_and_creation,
    race,
    reader_and_folds,
    stalled_folder,
    state_only_and_prune,
    state_only_commits,
    two_builders,
)

#: family -> the bounds its default run explores: (preemptions, kills, most schedules)
FAMILIES: dict[Callable[[World], list[Actor]], tuple[int, int, int]] = {
    race: (3, 1, 150),
    folds_and_a_commit: (2, 1, 60),
    stalled_folder: (2, 0, 60),
    reader_and_folds: (2, 0, 60),
    purge_and_creation: (2, 1, 60),
    prune_and_recreation: (1, 1, 60),
    commit_reviving: (2, 1, 60),
    state_only_commits: (1, 1, 40),
    state_only_and_prune: (1, 1, 40),
    build_commit_and_fold: (2, 1, 40),
    two_builders: (2, 1, 40),
}


@pytest.mark.parametrize("family", list(FAMILIES), ids=lambda f: f.__name__)
def test_every_schedule_of_the_family_keeps_the_counts(world: World, family: Callable[[World], list[Actor]]) -> None:
    preemptions, kills, limit = FAMILIES[family]
    report = world.explore(family(world), preemptions=preemptions, kills=kills, limit=limit, sample=8)
    assert not report.failures, str(report.failures[0])
    assert report.schedules > 1


@pytest.mark.soak
@pytest.mark.parametrize("family", list(FAMILIES), ids=lambda f: f.__name__)
def test_every_schedule_of_the_family_keeps_the_counts_deeper(
    world: World, family: Callable[[World], list[Actor]]
) -> None:
    """The soak's budget: one more preemption and a kill everywhere, forty times the
    schedules, and 400 random ones beyond them."""
    preemptions, kills, limit = FAMILIES[family]
    report = world.explore(family(world), preemptions=preemptions + 1, kills=1, limit=40 * limit, sample=400)
    assert not report.failures, str(report.failures[0])


# --- fixed schedules the explorer found, kept as regression tests ---------------------------


def test_the_race_schedule_itself(world: World) -> None:
    """The failing schedule the explorer printed on da388e1 (fails there: the counts say
    DONE 1 with nothing stored): the fold reads the counter and the dirty execution; prune
    settles its journal, reads the execution, journals it, marks it leaving, reads the
    counter and the dirty ids; the fold's counter update lands; prune's fails, and prune
    deletes. And progress: prune folds again what the fold's batch left dirty, so the
    execution is removed all the same (folded once only, it would stay)."""
    fold, prune = (Runner(a) for a in race(world))
    world.reset()
    follow(world, [(fold, 2), (prune, 6), (fold, 1), (prune, 99), (fold, 99)])
    world.settle()
    left = [d["_id"] for d in world.db[EXES].find({"tomb": {"$exists": False}}, {"_id": 1})]
    assert not left, f"no progress: {left} not removed by prune, raced by one fold"


def test_a_late_mark_does_not_land_on_an_id_created_again(world: World) -> None:
    """A folder applies a batch and stalls before marking it; prune marks, folds (marking the
    stalled batch, then its own) and deletes the execution; the id is created again; another
    prune folds a batch without it; the stalled folder's mark then finds the new incarnation,
    which must stay uncounted (Rule 3's lineage): counted as the old one's DONE, the next
    fold would subtract a DONE that the counters no longer hold."""
    y = done(world, "b", fold=True)
    x = done(world, "a", fold=False)
    world.keep()
    fold, prune_x, create, prune_y = (
        Runner(Actor("fold", world.fold)),
        Runner(Actor("prune x", world.prune(x))),
        Runner(Actor("create x", world.create(x))),
        Runner(Actor("prune y", world.prune(y))),
    )
    world.reset()
    follow(world, [(fold, 3), (prune_x, 99), (create, 99), (prune_y, 99), (fold, 99)])
    assert world.db[EXES].find_one({"_id": x}) is not None, "x was not created again"
    world.settle()
