"""The pending figures under every interleaving of commits that emit and spawn, a relay that
delivers, a fold and a sampler (tests/support/pending_families.py), run one call at a time in
every order up to a bound, with a kill after any step, on the real wire server: after every
step the backlog's counts, oldest ages and oldest holders equal the documents' (computed apart:
tests/support/pending_oracle.py), a sample is served within its minute and not past it, and
every schedule ends with everything delivered after a settling relay pass.

The planted faults show the family fails on what it names, each with the invariant's own
message: a relay that never delivers, a commit that adds entries without the `pending` flag,
a sample served 61 s after it was taken.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pymongo
import pytest

from harel_beanie.core import commit as commit_module
from harel_beanie.queries import samples as samples_module
from tests.support.explore import Actor
from tests.support.pending_families import PendingWorld, commits_relay_fold_and_sample

#: the default run's bounds: (preemptions, kills, most schedules), and random ones beyond
#: (each schedule checks three views after every step: about 2 s a schedule on a loaded machine)
BOUNDS = (1, 1, 10)
SAMPLED = 6


@pytest.fixture
def world(mongo_url: str, client: pymongo.MongoClient[Any], db_name: str) -> Iterator[PendingWorld]:
    w = PendingWorld(mongo_url, client, db_name)
    w.setup()
    yield w
    w.close()


def test_every_schedule_keeps_the_pending_figures_and_delivers_everything(world: PendingWorld) -> None:
    preemptions, kills, limit = BOUNDS
    report = world.explore(
        commits_relay_fold_and_sample(world), preemptions=preemptions, kills=kills, limit=limit, sample=SAMPLED
    )
    assert not report.failures, str(report.failures[0])
    assert report.schedules == limit and report.sampled == SAMPLED


@pytest.mark.soak
def test_every_schedule_keeps_the_pending_figures_deeper(world: PendingWorld) -> None:
    """The soak's budget: two preemptions, fifty times the schedules, 200 random ones."""
    _, kills, limit = BOUNDS
    report = world.explore(
        commits_relay_fold_and_sample(world), preemptions=2, kills=kills, limit=50 * limit, sample=200
    )
    assert not report.failures, str(report.failures[0])


def _first_failure(world: PendingWorld, actors: list[Actor]) -> str:
    report = world.explore(actors, preemptions=1, kills=0, limit=20)
    assert report.failures, "the planted fault went unnoticed"
    return report.failures[0].reason


def test_a_relay_that_never_delivers_fails_the_progress_check(
    world: PendingWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    def reads_only() -> Any:
        st = world.relay_store._state
        from harel_beanie.core import flows

        yield from flows.pending_spawns(st)
        yield from flows.pending_outbox(st)

    monkeypatch.setattr(world, "relay", reads_only)
    reason = _first_failure(world, commits_relay_fold_and_sample(world))
    assert reason.startswith("after the schedule and a settling fold: progress: entries (or the pending flag) left"), (
        reason
    )


def test_a_commit_adding_entries_without_the_flag_fails_the_figures(
    world: PendingWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    real: Callable[..., Any] = commit_module._cas_update

    def unflagged(*args: Any, **kwargs: Any) -> Any:
        cas, update = real(*args, **kwargs)
        update["$set"].pop("pending", None)
        return cas, update

    monkeypatch.setattr(commit_module, "_cas_update", unflagged)
    reason = _first_failure(world, commits_relay_fold_and_sample(world))
    assert reason.startswith("the pending figures differ from the documents': backlog(): pending_outbox"), reason


def test_a_sample_served_61_s_after_it_was_taken_fails_the_figures(
    world: PendingWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = samples_module.latest_sample

    async def lenient(samples: Any, now: Any = None, within: float = 0.0) -> Any:
        return await real(samples, now=now, within=samples_module.MINUTE + 5.0)

    monkeypatch.setattr(samples_module, "latest_sample", lenient)
    # the sample first, then the commits: the documents move on from what it holds
    w = world
    actors = [Actor("sampler", w.sampler), Actor("commits", w.commits), Actor("relay", w.relay), Actor("fold", w.fold)]
    reason = _first_failure(world, actors)
    assert "61 s after a sample" in reason, reason
