"""The transport's schedule families: workers claiming and acking one group's messages while
a partition lease changes hands, run one call at a time by the schedule explorer
(tests/support/explore.py) on the real wire server, with the transport's invariants checked
after every step.

Why this module exists: the partition leases (`harel_beanie.transport.ownership`) and the
claim's fence and give-back (`harel_beanie.transport.queues`, Rule 7) are state kept beside
the queues, argued in rules; these families run their flows interleaved in every order up to a
bound, with time moving between any two steps, and hold them to:

- no two owners: at every step, at most one worker holds a partition by its own clock;
- a worker acts only on what it owns: a claim hands over a message only of a partition the
  claimer holds when the claim returns;
- one message of a group in flight: a claim never hands over a group's message while another
  worker's lease on that group is still valid;
- FIFO per group: the acks take the group's messages in the order they were published (a
  message handed over again after its lease lapsed is the same head, not a later one);
- progress: at the end of every schedule (a kill's included: its claim's lease lapses), a
  settling worker takes the partition over and acks what is left, so every published
  message is acked (a transport that delivers nothing holds every safety check).

Time is virtual: every worker reads one clock the `Advance` step moves, plus its own skew.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pymongo
from harel.spec.states import Event

from harel_beanie.core.calls import Call, Flow
from harel_beanie.core.names import partition_collection, queue_names
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, Held, PartitionScope, part_of
from harel_beanie.store.dispatch import call, drive
from harel_beanie.transport import MongoTransport, claiming, ownership, queues
from harel_beanie.transport.ownership import LEASE_SECONDS
from tests.support.explore import Actor

#: the virtual time the families start at, and the first owner's lease on the group's partition
START, LEASE_END = 1000.0, 1010.0
VISIBILITY = 30.0
#: the message of the progress check (the planted-fault tests look for it)
NO_PROGRESS = "no progress"


@dataclass(frozen=True)
class Advance:
    """Not a database call: the virtual clock moves by `seconds` (one step of a schedule)."""

    seconds: float
    target: str = "clock"


@dataclass
class VirtualClock:
    now: float = START

    def of(self, skew: float) -> Callable[[], float]:
        return lambda: self.now + skew


@dataclass
class Worker:
    """One worker's view: its clock, its partition scope (what it believes it owns)."""

    name: str
    clock: Callable[[], float]
    scope: PartitionScope


@dataclass
class TransportWorld:
    """The start state (a group's messages queued, its partition leased to worker A) and the
    actors and checks of the families."""

    client: pymongo.MongoClient[Any]
    db_name: str
    clock: VirtualClock = field(default_factory=VirtualClock)
    workers: dict[str, Worker] = field(default_factory=dict)
    saved: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    published: list[str] = field(default_factory=list)
    in_flight: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # group -> (worker, until)
    acked: list[str] = field(default_factory=list)
    tokens: Any = None

    def __post_init__(self) -> None:
        self.transport = MongoTransport(self.client, self.db_name, self.clock.of(0.0), sharded=False)
        self.colls = self.transport._colls
        self.db = self.client[self.db_name]
        self.names = [*queue_names("harel"), partition_collection("harel")]
        self.part = part_of(self.group, DEFAULT_PARTITIONS)

    group = "grp:1"

    def setup(self, messages: int = 2) -> None:
        for i in range(messages):
            kind = f"m{i}"
            self.transport.publish(self.group, Event(kind=kind))
            self.published.append(kind)
        leases = self.db[partition_collection("harel")]
        for p in range(DEFAULT_PARTITIONS):  # the group's partition A's, every other one C's for good
            owner, until = ("A", LEASE_END) if p == self.part else ("C", 1e12)
            leases.insert_one({"_id": p, "owner": owner, "until": until, "epoch": 1})
        leases.insert_one({"_id": "member:A", "until": LEASE_END})
        leases.insert_one({"_id": "member:C", "until": 1e12})
        self.saved = {n: list(self.db[n].find({})) for n in self.names}

    def reset(self) -> None:
        for n, docs in self.saved.items():
            self.db[n].delete_many({})
            if docs:
                self.db[n].insert_many(copy.deepcopy(docs))
        self.clock.now = START
        self.in_flight, self.acked, self.workers = {}, [], {}
        self.tokens = itertools.count()

    def execute(self, c: Call) -> Any:
        if isinstance(c, Advance):
            self.clock.now += c.seconds
            return None
        return call(self.colls, c)

    def hex(self) -> str:
        """A claim's token, the same in every schedule (states met again are recognised)."""
        return f"{next(self.tokens):032x}"

    # --- the actors -----------------------------------------------------------------------

    def worker(self, name: str, skew: float, held: Optional[dict[int, Held]]) -> Worker:
        clock = self.clock.of(skew)
        w = Worker(name, clock, PartitionScope(held=held, clock=clock))
        self.workers[name] = w
        return w

    def holder(self, skew: float = 0.0) -> Callable[[], Flow[Any]]:
        """Worker A, which holds the group's partition until `LEASE_END` (by its clock): one
        claim, and the ack of what it got."""

        def make() -> Flow[Any]:
            a = self.worker("A", skew, {self.part: Held(1, LEASE_END - ownership.MARGIN)})
            yield from self._claim_and_ack(a)

        return make

    def taker(self, skew: float = 0.0) -> Callable[[], Flow[Any]]:
        """Worker B: one look at the leases (taking what lapsed by its clock), then a claim and
        the ack of what it got."""

        def make() -> Flow[Any]:
            b = self.worker("B", skew, {})
            owner = ownership.OwnerState("B", b.scope, clock=b.clock)
            held = yield from ownership.tick(owner)
            b.scope.held = dict(held)  # what the worker's PartitionOwner does after a look
            yield from self._claim_and_ack(b)

        return make

    def time(self, *steps: float) -> Callable[[], Flow[Any]]:
        def make() -> Flow[Any]:
            for s in steps:
                yield Advance(s)

        return make

    def _claim_and_ack(self, w: Worker) -> Flow[Any]:
        st = queues.QueueState(w.clock, w.scope)
        lease = yield from claiming.claim(st, w.name, VISIBILITY)
        if lease is None:
            return
        self._acting(w, lease)
        yield from queues.ack(st, lease)
        self._acked(w, lease)

    # --- the checks -----------------------------------------------------------------------

    def _acting(self, w: Worker, lease: Any) -> None:
        part = part_of(lease.group_id, DEFAULT_PARTITIONS)
        owned = w.scope.owned() or {}
        assert part in owned, f"{w.name} was handed a message of partition {part}, which it does not hold"
        now = self.clock.now
        others = [(n, u) for n, u in self.in_flight.get(lease.group_id, []) if n != w.name and u > now]
        assert not others, f"{w.name} was handed {lease.group_id!r} while {others} held it in flight"
        self.in_flight.setdefault(lease.group_id, []).append((w.name, now + VISIBILITY))
        kind = lease.event.kind
        done = list(dict.fromkeys(self.acked))
        expected = self.published[len(done)] if len(done) < len(self.published) else None
        assert kind in (expected, done[-1] if done else None), f"{w.name} was handed {kind}, the head is {expected}"

    def _acked(self, w: Worker, lease: Any) -> None:
        self.acked.append(lease.event.kind)
        self.in_flight[lease.group_id] = [(n, u) for n, u in self.in_flight[lease.group_id] if n != w.name]

    def check(self, _steps: Any = None) -> None:
        holders = [n for n, w in self.workers.items() if self.part in (w.scope.owned() or {})]
        assert len(holders) <= 1, f"partition {self.part} held by {holders} at once (virtual time {self.clock.now})"

    def settle(self) -> None:
        order = list(dict.fromkeys(self.acked))
        assert order == self.published[: len(order)], f"acked {self.acked}, published {self.published}"
        self.finish()
        order = list(dict.fromkeys(self.acked))
        assert order == self.published, f"{NO_PROGRESS}: acked {order} of {self.published} after a settling worker"

    def finish(self) -> None:
        """Progress: once every lease the schedule left has lapsed (a killed worker's claim
        included), one more worker looks at the leases, takes the group's partition and
        claims and acks until nothing is left; the safety checks hold over its steps too."""
        self.clock.now += LEASE_SECONDS + VISIBILITY + 1.0
        s = self.worker("S", 0.0, {})
        owner = ownership.OwnerState("S", s.scope, clock=s.clock)
        s.scope.held = dict(drive(ownership.tick(owner), self.execute))
        for _ in range(len(self.published) + 1):  # bounded: a claim that hands nothing ends it
            st = queues.QueueState(s.clock, s.scope)
            lease = drive(claiming.claim(st, s.name, VISIBILITY), self.execute)
            if lease is None:
                return
            self._acting(s, lease)
            drive(queues.ack(st, lease), self.execute)
            self._acked(s, lease)
            self.check()

    def fingerprint(self) -> Any:
        docs = {n: sorted(repr(sorted(d.items())) for d in self.db[n].find({})) for n in self.names}
        return (repr(docs), self.clock.now, tuple(self.acked), repr(self.in_flight))


@dataclass
class SharingWorld(TransportWorld):
    """Three workers sharing the 16 partitions from none held (an uneven share: 6, 6 and 4),
    each making its first look at the leases (`ownership.tick`) while the others make theirs.
    At every step no partition is held by two of them by their clocks; at the end (after a
    kill, once the killed one's leases lapsed) the live ones look until settled, and then
    every partition is owned, by one of them."""

    names_: tuple[str, ...] = ("a", "b", "c")
    owners: dict[str, ownership.OwnerState] = field(default_factory=dict)
    dead: set[str] = field(default_factory=set)

    def setup(self, messages: int = 0) -> None:
        self.saved = {partition_collection("harel"): []}

    def reset(self) -> None:
        super().reset()
        self.dead = set()
        self.owners = {}
        for name in self.names_:
            w = self.worker(name, 0.0, {})
            self.owners[name] = ownership.OwnerState(name, w.scope, clock=w.clock)

    def look(self, name: str) -> Callable[[], Flow[Any]]:
        def make() -> Flow[Any]:
            owner = self.owners[name]
            held = yield from ownership.tick(owner)
            self.workers[name].scope.held = dict(held)  # what the worker's PartitionOwner does

        return make

    def check(self, steps: Any = None) -> None:
        self.dead |= {s.actor for s in steps or [] if s.choice[0] == "kill"}
        seen: dict[int, str] = {}
        for name, w in self.workers.items():
            for p in w.scope.owned() or {}:
                assert p not in seen, f"partition {p} held by {[seen[p], name]} at once (virtual time {self.clock.now})"
                seen[p] = name

    def settle(self) -> None:
        live = [n for n in self.names_ if n not in self.dead]
        if self.dead:  # the dead one's leases and member document lapse first
            self.clock.now += LEASE_SECONDS + 1.0
        for _ in range(3):
            self.clock.now += ownership.RENEW_EVERY
            for name in live:
                self.workers[name].scope.held = dict(drive(ownership.tick(self.owners[name]), self.execute))
                self.check()
        owned = sorted(p for w in self.workers.values() for p in w.scope.owned() or {})
        assert owned == list(range(DEFAULT_PARTITIONS)), (
            f"{NO_PROGRESS}: after settling looks the partitions owned are {owned}"
        )

    def fingerprint(self) -> Any:
        leases = sorted(repr(sorted(d.items())) for d in self.db[partition_collection("harel")].find({}))
        return (repr(leases), self.clock.now, repr({n: w.scope.held for n, w in self.workers.items()}))


def sharing(world: SharingWorld) -> list[Actor]:
    """The three workers' first looks at once, and time moving between them."""
    return [*(Actor(n, world.look(n)) for n in world.names_), Actor("time", world.time(ownership.RENEW_EVERY))]


def families(world: TransportWorld) -> dict[str, list[Actor]]:
    """The families, each over the same start state (`setup` first)."""
    return {
        # A's lease ends while its claim is on the wire, and B takes the partition over
        "a claim across a lease's end": [
            Actor("A", world.holder()),
            Actor("time", world.time(6.0, 6.0)),
            Actor("B", world.taker()),
        ],
        # the same with B's clock ahead of A's, within MARGIN
        "a skewed taker within the margin": [
            Actor("A", world.holder()),
            Actor("time", world.time(4.0, 3.0, 5.0)),
            Actor("B", world.taker(skew=ownership.MARGIN * 0.75)),
        ],
    }


def beyond_the_margin(world: TransportWorld) -> list[Actor]:
    """B's clock ahead of A's by more than MARGIN: B takes the partition while A, by its own
    clock, still holds it (what ownership.py's Rule 3 requires of the hosts' clocks)."""
    return [
        Actor("A", world.holder()),
        Actor("time", world.time(4.0, 3.0, 5.0)),
        Actor("B", world.taker(skew=ownership.MARGIN * 1.5)),
    ]
