"""Transport faults: every command of the transport failed in turn, and every call's reply
lost, delivers every published message exactly once (by its id, as harel's dedupe counts it),
in its group's order, and leaves the queues drained.

A scenario publishes eight messages in three groups through the transport (one of them too
large for its queue document, so the group spills into overflow documents, and one group of
a higher priority), and a consumer does what harel's worker does with them: claims (first at
the high priority), handles each message once by its id, acks, nacks one back at once and
parks another. After a failure it does what harel's engine does: a publish whose outcome it
never learned is sent again, a claim, ack or nack is retried, and a message whose lease was
lost comes back once the lease expires (the scenario's clock moves past it).

The faults, on the transport's own client only (scoped by appName, on a server of the test's
own): failCommand at the k-th command (the connection closed, ShutdownInProgress,
MaxTimeMSExpired, a plain error, a writeConcernError after the write applied), and the
transport's own calls wrapped for each kind of call: applied with the reply lost, or dropped.
Every run also checks that its fault fired once, of its kind, on the very command it was
aimed at: the k-th of the names it targets, which is the command the fault-free run sends at
that point (its name and collection, and every command before it the same).
The worker-level faults (a worker SIGKILLed holding a lease, the server restarted under
running workers) run on this transport in tests/reliability/test_reliability_crash.py, whose workers
are `harel-beanie worker` on its default transport.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any, Callable, Collection, Iterator

import pymongo
import pytest
from harel.spec.states import Event
from pymongo.errors import AutoReconnect, PyMongoError

from harel_beanie.core import calls
from harel_beanie.core.names import queue_names
from harel_beanie.transport import AsyncMongoTransport, MongoTransport
from harel_beanie.transport.documents import INLINE_BYTES
from tests.reliability.test_reliability_faults import (  # noqa: F401 (fixtures used by name)
    FAULTS,
    SEEN_AS,
    VICTIM,
    admin,
    arm,
    fault_url,
    where,
)
from tests.support.both import BlockingAsyncStore
from tests.support.wire import Recorder

VISIBILITY = 30.0
BIG = {"blob": "x" * (INLINE_BYTES + 1024)}
#: (group, message id, priority, data): the order each group's messages are published in
MESSAGES = [
    ("A", "a1", 0, {}),
    ("B", "b1", 0, {}),
    ("A", "a2", 0, {}),
    ("B", "b2", 0, BIG),  # too large inline: B spills from here on
    ("C", "c1", 2, {}),
    ("B", "b3", 0, {}),
    ("A", "a3", 0, {}),
    ("C", "c2", 2, {}),
]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Consumer:
    """harel's side: retry what failed, handle each message once by its id."""

    def __init__(self, transport: Any, clock: Clock) -> None:
        self.t = transport
        self.clock = clock
        self.seen: Counter[str] = Counter()
        self.effects: Counter[str] = Counter()
        self.order: dict[str, list[str]] = {}

    def retry(self, op: Callable[[], Any], attempts: int = 40) -> Any:
        for _ in range(attempts):
            try:
                return op()
            except PyMongoError as err:
                self.seen[type(err).__name__] += 1
        raise AssertionError(f"no recovery after {attempts} attempts: {self.seen}")

    def handle(self, lease: Any) -> None:
        mid = lease.event.id
        if not self.effects[mid]:  # harel's dedupe: a message handled once is not handled again
            self.order.setdefault(lease.group_id, []).append(mid)
        self.effects[mid] += 1 if not self.effects[mid] else 0
        self.retry(lambda: self.t.ack(lease))

    def run(self) -> None:
        for group, mid, priority, data in MESSAGES:
            event = Event(id=mid, kind="M", data=data)
            self.retry(lambda: self.t.publish(group, event, priority=priority))
        first = self.retry(lambda: self.t.claim("w", VISIBILITY, min_priority=2))
        if first is not None:
            self.retry(lambda: self.t.nack(first))  # back at once: claimed again below
        parked = drained = False
        for _ in range(200):
            lease = self.retry(lambda: self.t.claim("w", VISIBILITY))
            if lease is None:
                if len([m for m in self.effects if self.effects[m]]) == len(MESSAGES) and drained:
                    return
                # a lease whose holder never learned it ends; once everything was handled,
                # one more look after that tells the queues are drained
                drained = len([m for m in self.effects if self.effects[m]]) == len(MESSAGES)
                self.clock.now += VISIBILITY + 1
                continue
            drained = False
            if lease.event.id == "a2" and not parked:
                parked = True
                self.retry(lambda: self.t.nack(lease, delay=5.0))
                self.clock.now += 6
                continue
            self.handle(lease)
        raise AssertionError(f"the scenario did not end: {self.effects}")


def check(consumer: Consumer, db: Any) -> None:
    """Every message handled exactly once, each group in publish order, the queues drained."""
    assert {m: n for m, n in consumer.effects.items() if n} == {m: 1 for _, m, _, _ in MESSAGES}
    for group in ("A", "B", "C"):
        assert consumer.order[group] == [m for g, m, _, _ in MESSAGES if g == group], consumer.order
    queues, overflow = queue_names("harel")
    for doc in db[queues].find({}):
        assert doc.get("pending", 0) == 0 and not doc.get("q") and not doc.get("spill"), doc
    assert db[overflow].count_documents({}) == 0


class Run:
    def __init__(self, url: str, client: pymongo.MongoClient[Any]) -> None:
        self.url, self.admin = url, client
        self.db = "hbtq_" + uuid.uuid4().hex[:10]
        self.log = Recorder()
        self.clock = Clock()
        self.closers: list[Callable[[], None]] = []

    def transport(self, kind: str, cls: Any = None) -> Any:
        options = {"appName": VICTIM, "event_listeners": [self.log], "heartbeatFrequencyMS": 500}
        url, db, clock = self.url, self.db, self.clock
        if kind == "sync":
            t = (cls or MongoTransport)(pymongo.MongoClient(url, **options), db, clock)
            self.closers.append(t.close)
            return t
        facade = BlockingAsyncStore(
            lambda: (cls or AsyncMongoTransport)(pymongo.AsyncMongoClient(url, **options), db, clock)
        )
        self.closers.append(facade.shutdown)
        return facade

    def close(self) -> None:
        self.admin.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
        closers, self.closers = self.closers, []  # closed once, by the test or at teardown
        for close in closers:
            close()
        self.admin.drop_database(self.db)


@pytest.fixture
def runs(fault_url: str, admin: pymongo.MongoClient[Any]) -> Iterator[Callable[[], Run]]:  # noqa: F811
    made: list[Run] = []

    def make() -> Run:
        made.append(Run(fault_url, admin))
        return made[-1]

    yield make
    for r in made:
        r.close()


Sent = list[tuple[str, dict[str, Any]]]  # commands as the Recorder keeps them: (name, command)
_baselines: dict[str, Sent] = {}


def baseline(runs: Callable[[], Run], kind: str) -> Sent:
    """The commands a fault-free run sends (and that run checked), computed once per transport."""
    if kind not in _baselines:
        run = runs()
        consumer = Consumer(run.transport(kind), run.clock)
        consumer.run()
        check(consumer, run.admin[run.db])
        assert not consumer.seen and not run.log.faults
        _baselines[kind] = list(run.log.commands)
    return _baselines[kind]


def commands_of(runs: Callable[[], Run], kind: str) -> list[str]:
    """The names of the commands a fault-free run sends."""
    return [n for n, _ in baseline(runs, kind)]


# --- where a fault hit ------------------------------------------------------------------------

# The fail point (and each wrapped call below) counts only the commands of the names it targets:
# `skip` k aims it at the k-th of them. What it meets there is read off the fault-free run's
# log; a run's own log then shows the fault hit exactly that command.


def shape(sent: Sent) -> list[tuple[str, str]]:
    """Each command's name and collection."""
    return [(name, command[name]) for name, command in sent]


def nth(sent: Sent, names: Collection[str], k: int) -> int:
    """The index in `sent` of its k-th command (from 0) named in `names`."""
    counted = [i for i, (n, _) in enumerate(sent) if n in names]
    assert k < len(counted), f"only {len(counted)} commands named {sorted(names)} were sent, no #{k}"
    return counted[k]


def assert_fired_where_aimed(log: Recorder, base: Sent, fault: str, k: int) -> None:
    """The fail point armed with `fault` at `skip` k fired once, as the fault shows on the
    client, on the k-th command of the run named in the fault's targets, and that command is
    the fault-free run's k-th: the same name and collection, every command before it the same."""
    targets, _ = FAULTS[fault]
    aimed = nth(base, targets, k)
    at = nth(log.commands, targets, k)
    assert shape(log.commands[: at + 1]) == shape(base[: aimed + 1]), (k, shape(base[aimed : aimed + 1]))
    name, command = log.commands[at]
    assert where(log.hits) == [(at, SEEN_AS[fault], name, command[name])], (k, at, where(log.hits))


def sweep(runs: Callable[[], Run], admin: Any, kind: str, fault: str, stride: int) -> dict[str, int]:  # noqa: F811
    targets, data = FAULTS[fault]
    base = baseline(runs, kind)
    hits = sum(1 for n, _ in base if n in targets)
    tally: Counter[str] = Counter()
    for k in range(0, hits, stride):
        run = runs()
        consumer = Consumer(run.transport(kind), run.clock)
        arm(admin, targets, data, skip=k)
        consumer.run()
        admin.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
        assert_fired_where_aimed(run.log, base, fault, k)
        check(consumer, admin[run.db])
        tally.update(run.log.faults)
        tally["runs"] += 1
        run.close()
    return dict(tally)


# a dropped connection costs the driver half a second to re-check the server: every fifth
# to ninth command in the default run (kept within the suite's 15 minutes), every command
# under `make soak`; the sync transport's applied-then-failed write at every command
DEFAULT_STRIDES = {
    "sync": {"connection closed": 5, "ShutdownInProgress": 7, "MaxTimeMSExpired": 5, "command error": 5},
    "async": {
        "connection closed": 6,
        "ShutdownInProgress": 9,
        "MaxTimeMSExpired": 6,
        "command error": 6,
        "writeConcernError (applied)": 3,
    },
}


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_at_any_transport_command_loses_and_doubles_nothing(runs, admin, kind, fault, figures):  # noqa: F811
    """failCommand at the k-th command of the scenario, each fault kind, both transports:
    every message handled exactly once, in order, the queues drained (every command for the
    sync transport's applied-then-failed write, every n-th otherwise). Each run's fault fired
    once, of its kind, on the k-th command of the names it targets: the fault-free run's k-th,
    name and collection."""
    figures.set(**sweep(runs, admin, kind, fault, DEFAULT_STRIDES[kind].get(fault, 1)))


@pytest.mark.soak
@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_at_every_transport_command_soak(runs, admin, kind, fault, figures):  # noqa: F811
    figures.set(**sweep(runs, admin, kind, fault, 1))


# --- the transport's own calls: applied with the reply lost, or dropped -------------------------

CALL_KINDS: dict[str, type] = {
    "update": calls.UpdateOne,
    "findAndModify": calls.FindOneAndUpdate,
    "insert": calls.InsertOne,
    "delete": calls.DeleteOne,
}


def _fires(plan: dict[str, Any], transport: Any, c: calls.Call) -> bool:
    """Whether the fault fires on call `c`: the `skip`-th call of kind `kind`. When it does, the
    plan notes where: how many commands the run's log held before it (`at`) and the collection
    the call addresses."""
    if not isinstance(c, plan["kind"]) or plan["fired"]:
        return False
    if plan["skip"]:
        plan["skip"] -= 1
        return False
    plan.update(fired=1, at=len(plan["log"].commands), collection=transport._colls[c.target].name)
    return True


def _faulty(base: type, plan: dict[str, Any]) -> type:
    """`base` whose `skip`-th call of kind `kind` is applied with its reply lost (whatever it
    said, a write error too: the caller gets an AutoReconnect), or dropped."""

    if base is MongoTransport:

        class SyncFaulty(MongoTransport):
            def _call(self, c: calls.Call) -> Any:
                if _fires(plan, self, c):
                    if plan["mode"] == "applied, reply lost":
                        try:
                            super()._call(c)
                        except PyMongoError:
                            pass  # lost with the reply (a refused upsert's duplicate key, say)
                    raise AutoReconnect(f"injected: {plan['mode']}")
                return super()._call(c)

        return SyncFaulty

    class AsyncFaulty(AsyncMongoTransport):
        async def _call(self, c: calls.Call) -> Any:
            if _fires(plan, self, c):
                if plan["mode"] == "applied, reply lost":
                    try:
                        await super()._call(c)
                    except PyMongoError:
                        pass  # lost with the reply (a refused upsert's duplicate key, say)
                raise AutoReconnect(f"injected: {plan['mode']}")
            return await super()._call(c)

    return AsyncFaulty


def assert_lost_where_aimed(log: Recorder, base: Sent, consumer: Consumer, plan: dict[str, Any], k: int) -> None:
    """The wrapped call's fault fired once, on the k-th call of its kind, and that call is the
    fault-free run's k-th command of its name: every command before it the same, the same
    collection; applied with the reply lost, that command went out and its reply came back
    (no fault on the wire); dropped, the wrapper raised before sending it. The consumer saw the
    one injected AutoReconnect."""
    assert plan["fired"] == 1, (plan["call"], k)  # the fault really fired
    aimed = nth(base, {plan["call"]}, k)
    at = plan["at"]
    assert shape(log.commands[:at]) == shape(base[:aimed]), (k, at, aimed)  # so k of its name before it
    assert plan["collection"] == base[aimed][1][plan["call"]], (k, plan["collection"])
    if plan["mode"] == "applied, reply lost":
        assert shape(log.commands[at : at + 1]) == shape(base[aimed : aimed + 1]), (k, at)
    assert not log.hits, where(log.hits)
    assert consumer.seen == {"AutoReconnect": 1}, (k, consumer.seen)


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("mode", ["applied, reply lost", "dropped"])
@pytest.mark.parametrize("call", list(CALL_KINDS))
def test_every_call_of_the_transport_survives_a_lost_reply(runs, kind, mode, call, figures):
    """Each call of each kind the scenario makes, in turn, applied with its reply lost or
    dropped before it ran: every message handled exactly once, in order, queues drained. Each
    run's fault fired once, on the k-th call of its kind: the fault-free run's k-th command of
    that name, same collection, and the consumer saw that one lost reply."""
    base = baseline(runs, kind)
    n = sum(1 for name in commands_of(runs, kind) if name == call)
    fired = 0
    for k in range(n):
        run = runs()
        plan = {"call": call, "kind": CALL_KINDS[call], "mode": mode, "skip": k, "fired": 0, "log": run.log}
        consumer = Consumer(
            run.transport(kind, _faulty(MongoTransport if kind == "sync" else AsyncMongoTransport, plan)), run.clock
        )
        consumer.run()
        assert_lost_where_aimed(run.log, base, consumer, plan, k)
        check(consumer, run.admin[run.db])
        fired += 1
        run.close()
    figures.set(faults=fired)
