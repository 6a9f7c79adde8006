"""The partition leases and the claim's fence under every interleaving: a worker whose lease
ends while its claim is on the wire, a worker taking the partition over, time moving between
any two steps, explored by tests/support/explore.py over tests/support/transport_families.py
on the real wire server; and the planted faults (the claim's give-back removed, the lease's
clock check removed) caught with their schedule printed."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pymongo
import pytest

from harel_beanie.core import partitions
from harel_beanie.transport import claiming, ownership
from tests.support.explore import Actor, Explorer, Report
from tests.support.mutation import mutated
from tests.support.transport_families import (
    NO_PROGRESS,
    SharingWorld,
    TransportWorld,
    beyond_the_margin,
    families,
    sharing,
)

FAMILIES = ["a claim across a lease's end", "a skewed taker within the margin"]


@pytest.fixture
def world(mongo_url: str, db_name: str, monkeypatch: pytest.MonkeyPatch) -> TransportWorld:
    w = TransportWorld(pymongo.MongoClient(mongo_url), db_name)
    w.setup()
    # claim tokens the same in every schedule, so a state met again is recognised
    monkeypatch.setattr(claiming, "uuid", SimpleNamespace(uuid4=lambda: SimpleNamespace(hex=w.hex())))
    return w


def explore(world: TransportWorld, actors: list[Actor], **bounds: Any) -> Report:
    options: dict[str, Any] = dict(preemptions=2, kills=1, limit=1500, sample=30, seed=int(time.time()))
    options.update(bounds)
    report = Explorer(
        actors, world.reset, world.execute, world.check, world.settle, fingerprint=world.fingerprint, **options
    ).run()
    print(
        f"explored {report.schedules} schedules ({'all' if report.exhausted else 'bounded'}), sampled {report.sampled}"
    )
    return report


@pytest.mark.parametrize("name", FAMILIES)
def test_every_schedule_keeps_one_owner_one_message_in_flight_and_fifo(world: TransportWorld, name: str) -> None:
    report = explore(world, families(world)[name])
    assert not report.failures, str(report.failures[0])
    assert report.schedules > 1


def test_a_clock_ahead_beyond_the_margin_makes_two_owners(world: TransportWorld) -> None:
    """What the hosts' clock requirement (ownership.py, Rule 3) is for: with B's clock ahead
    of A's by more than MARGIN, some schedule has both holding the partition at once."""
    report = explore(world, beyond_the_margin(world), max_failures=1, sample=0)
    assert report.failures and "held by ['A', 'B'] at once" in str(report.failures[0]), report
    print(report.failures[0])


#: name -> (module, function, source as it is, source with the fault, the start of the
#: invariant's message it must break)
PLANTED = {
    # a claim that comes back after its partition's lease ended keeps the group (Rule 7)
    "the claim's give-back": (
        claiming,
        "_heads",
        "if owned is not None and (0 if part is None else part) not in owned:",
        "if False:",
        "was handed a message of partition",
    ),
    # a worker acts on a partition whatever its lease's end, by its clock (Rule 3)
    "the lease's clock check": (
        partitions,
        "PartitionScope.owned",
        "for p, h in self.held.items() if h.until > now}",
        "for p, h in self.held.items()}",
        "held by ['A', 'B'] at once",
    ),
    # the lease's end read the wrong way round: nothing owned, so nothing claimed; every
    # safety check holds over a transport that delivers nothing, only progress fails
    "a clock read wrongly": (
        partitions,
        "PartitionScope.owned",
        "if h.until > now}",
        "if h.until < now}",
        NO_PROGRESS,
    ),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_the_explorer_catches_the_planted_fault(world: TransportWorld, name: str) -> None:
    module, function, old, new, message = PLANTED[name]
    with mutated(module, function, old, new):
        report = explore(world, families(world)["a claim across a lease's end"], max_failures=1, sample=0)
    assert report.failures, f"no schedule caught {name} ({report.schedules} tried)"
    caught = report.failures[0]
    print(f"{name}: {report.schedules} schedules until\n{caught}")
    assert message in caught.reason, f"{name} broke another check than its own: {caught.reason}"


@pytest.fixture
def sharing_world(mongo_url: str, db_name: str) -> SharingWorld:
    w = SharingWorld(pymongo.MongoClient(mongo_url), db_name)
    w.setup()
    return w


def test_three_workers_share_sixteen_partitions_one_owner_each_and_all_owned(sharing_world: SharingWorld) -> None:
    """An uneven share (16 partitions, three workers: 6, 6 and 4): their first looks in
    every order up to the bound keep one owner a partition, and settling looks leave none
    unowned, a kill's included."""
    report = explore(sharing_world, sharing(sharing_world), preemptions=1, kills=1, limit=40, sample=5)
    assert not report.failures, str(report.failures[0])


def test_the_sharing_family_catches_a_fair_share_rounded_down(sharing_world: SharingWorld) -> None:
    """Rule 2's share `ceil(P / members)` as `P // members`: three workers hold 5 each and
    the 16th partition is no one's for good (the progress check's own message)."""
    fault = ("share = math.ceil(st.scope.parts / max(1, members))", "share = st.scope.parts // max(1, members)")
    with mutated(ownership, "tick", *fault):
        report = explore(sharing_world, sharing(sharing_world), preemptions=0, kills=0, sample=0, max_failures=1)
    assert report.failures, f"no schedule caught the share rounded down ({report.schedules} tried)"
    assert NO_PROGRESS in report.failures[0].reason, report.failures[0].reason
    print(report.failures[0])
