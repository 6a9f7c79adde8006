"""The write oracle of the transport: after each drawn publish, claim, ack and nack, the whole
database is what the reference model (tests/support/write_model.py) makes of it before.

Each example seeds the queues through the transport itself (drawn publishes into a few
groups, one group sometimes filled to its inline bound so that it spills, messages over the
inline size, claims, acks, nacks and parks), then makes one call with drawn arguments (groups
stored or not, leases held, acked already or taken over, priorities, delays). The
transport's clock is pinned; the claim's token and an overflow document's id are the values
the model takes from the answer or leaves `Drawn`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import pymongo
import pytest
from harel.spec.states import Event
from hypothesis import given, settings
from hypothesis import strategies as st

from harel_beanie.transport import MongoTransport
from harel_beanie.transport.queues import QueueLease
from tests.support import write_model as model
from tests.support.fuzz_strategies import oracle_budget as budget
from tests.support.write_model import expect_equal, snapshot

CLOCK = 1_800_000_000.5
groups = st.sampled_from(["g1", "g2:Pay:0", "$g.x", "日"])
small = st.builds(
    Event, kind=st.sampled_from(["A", "B"]), data=st.dictionaries(st.sampled_from(["k", "$k"]), st.integers())
)
big = st.just(Event(kind="Big", data={"x": "y" * (model.INLINE_BYTES + 1)}))
events = st.one_of(small, small, small, small, big)
priorities = st.integers(-2, 4)


@dataclass
class Op:
    """One seeded call: publish (group, event, priority), claim, ack or nack of a lease held
    (by its index), with a park delay."""

    kind: str
    group: str
    event: Event
    priority: int
    lease: int
    delay: float


ops = st.builds(
    Op,
    st.sampled_from(["publish", "publish", "publish", "claim", "ack", "nack"]),
    groups,
    events,
    priorities,
    st.integers(0, 3),
    st.sampled_from([0.0, 0.0, 30.0]),
)


class Queues:
    """A transport on a database of its own, its clock pinned, and the leases it handed out."""

    def __init__(self, url: str, client: Any, db_name: str) -> None:
        self.db = client[db_name]
        self.t = MongoTransport(pymongo.MongoClient(url), db_name, clock=lambda: CLOCK)
        self.t.init()
        self.leases: list[QueueLease] = []

    def seed(self, world: list[Op], fill: Optional[str]) -> None:
        for name in (model.QUEUES, model.OVERFLOW):
            self.db[name].delete_many({})
        self.leases = []
        if fill is not None:  # a group at its inline bound: the next publish spills
            for n in range(model.INLINE_MAX):
                self.t.publish(fill, Event(kind="F", data={"n": n}))
        for op in world:
            if op.kind == "publish":
                self.t.publish(op.group, op.event, op.priority)
            elif op.kind == "claim":
                lease = self.t.claim("w", 60.0)
                if lease is not None:
                    self.leases.append(lease)
            elif self.leases:
                lease = self.leases[op.lease % len(self.leases)]
                self.t.ack(lease) if op.kind == "ack" else self.t.nack(lease, op.delay)


@pytest.fixture
def queues(mongo_url: str, client: Any, db_name: str) -> Iterator[Queues]:
    q = Queues(mongo_url, client, db_name)
    yield q
    q.t.close()


worlds = st.tuples(st.lists(ops, max_size=8), st.one_of(st.none(), st.none(), groups))


def publish_property(q: Queues, data: st.DataObject, case: str) -> None:
    group, event, priority = data.draw(groups), data.draw(events), data.draw(priorities)
    if case == "into a full group":  # its inline bound reached: this message spills
        group, event = "full", data.draw(small)
        for n in range(model.INLINE_MAX):
            q.t.publish(group, Event(kind="F", data={"n": n}))
    before = snapshot(q.db)
    q.t.publish(group, event, priority)
    expected = model.publish(before, group, event.model_dump_json(), priority, CLOCK)
    spilled = len(expected.get(model.OVERFLOW, {})) > len(before.get(model.OVERFLOW, {}))
    assert spilled or case != "into a full group"
    expect_equal(f"publish({group!r}, priority={priority})", expected, snapshot(q.db))


def claim_property(q: Queues, data: st.DataObject, case: str) -> None:
    visibility, low = data.draw(st.sampled_from([1.0, 60.0])), data.draw(st.integers(-1, 3))
    if case == "something due":
        q.t.publish("due", data.draw(events), 3)
    before = snapshot(q.db)
    lease = q.t.claim("w:1", visibility, low)
    token = None if lease is None else lease.token
    expected, head = model.claim(before, CLOCK, CLOCK + visibility, low, token)
    assert (head is None) == (lease is None), f"claim answered {lease}, the model says {head}"
    assert head is not None or case != "something due"
    if lease is not None and head is not None:
        assert token is not None and token.startswith("w:1:")
        assert (lease.group_id, lease.event.model_dump_json()) == head
        assert lease.seq == int(before[model.QUEUES][lease.group_id].get("acked") or 0) + 1
    expect_equal(f"claim(min_priority={low})", expected, snapshot(q.db))


def ack_property(q: Queues, data: st.DataObject, case: str, nack: bool) -> None:
    top = 100  # a priority only this case's group has: its claim takes that group
    if case == "an overflow head":
        q.t.publish("spilt", Event(kind="Big", data={"x": "y" * (model.INLINE_BYTES + 1)}), top)
    else:
        q.t.publish("mine", data.draw(small), top)
    lease = q.t.claim("w:2", 60.0, top)
    assert lease is not None and (lease.overflow_id is not None) == (case == "an overflow head")
    if case == "lost":
        q.t.ack(lease)  # acked already: the call meets a lease no longer held
    before = snapshot(q.db)
    if nack:
        delay = data.draw(st.sampled_from([0.0, 5.0]))
        q.t.nack(lease, delay)
        expected = model.nack_message(before, lease.group_id, lease.token, delay, CLOCK)
    else:
        q.t.ack(lease)
        expected = model.ack_message(before, lease.group_id, lease.token, lease.overflow_id, lease.size, CLOCK)
    assert (expected == before) == (case == "lost")
    expect_equal(f"{'nack' if nack else 'ack'} of {lease.group_id!r}", expected, snapshot(q.db))


PROPERTIES: dict[str, Callable[[Queues, st.DataObject, str], None]] = {
    "publish": publish_property,
    "claim": claim_property,
    "ack": lambda q, d, c: ack_property(q, d, c, nack=False),
    "nack": lambda q, d, c: ack_property(q, d, c, nack=True),
}
#: the cases each call is run in, each with its own examples (each property asserts its
#: case's outcome)
CASES = {
    "publish": ["any", "into a full group"],
    "claim": ["any", "something due"],
    "ack": ["held", "lost", "an overflow head"],
    "nack": ["held", "lost", "an overflow head"],
}


def run(q: Queues, door: str, examples: settings) -> None:
    for case in CASES[door]:

        @examples
        @given(world=worlds, data=st.data())
        def prop(world: tuple[list[Op], Optional[str]], data: st.DataObject) -> None:
            q.seed(*world)
            PROPERTIES[door](q, data, case)

        prop()


@pytest.mark.parametrize("door", sorted(PROPERTIES))
def test_transport_write_is_exactly_its_model(queues: Queues, door: str) -> None:
    run(queues, door, budget(10))


@pytest.mark.soak
@pytest.mark.parametrize("door", sorted(PROPERTIES))
def test_transport_write_is_exactly_its_model_at_length(queues: Queues, door: str) -> None:
    run(queues, door, settings(budget(200), derandomize=False))
