"""Seqs unique by construction: each clause of the argument in `harel_beanie.core.seqs`, tried on
the real server with many store instances, frozen, stepped and skewed clocks, instances that
outlive their lease, and harel's own counters beside them.

Clocks are the stores' own (`StoreState.clock` for lease expiry in wall seconds, the mint's
millisecond clock for the seqs), replaced here so that the worst cases happen on purpose:
every instance minting in the same millisecond, a lease expiring while its holder lives.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator

import pymongo
import pytest
from harel.engine.execution import Execution
from harel.spec.states import Event

from harel_beanie import MongoStore
from harel_beanie.core import flows
from harel_beanie.core.seqs import LEASE_SPAN_MS, LEASE_TTL_S, MS_SHIFT, NODES, SeqMint, lease_id, node_of
from tests.support.wire import Recorder

FROZEN_MS = 90_000_000_000  # a millisecond of the seq epoch (late 2026), the same for everyone


class Clocks:
    """A wall clock (seconds) and a seq clock (ms of the seq epoch) that tests move by hand."""

    def __init__(self) -> None:
        self.wall = 1_800_000_000.0
        self.ms = FROZEN_MS

    def install(self, store: MongoStore, ms: Callable[[], int] | None = None) -> MongoStore:
        store._state.clock = lambda: self.wall
        store._state.mint = SeqMint(clock_ms=ms or (lambda: self.ms))
        return store


@pytest.fixture
def shared(mongo_url: str) -> Iterator[pymongo.MongoClient[Any]]:
    c: pymongo.MongoClient[Any] = pymongo.MongoClient(mongo_url)
    yield c
    c.close()


def mint(store: MongoStore, n: int = 1, above: int = 0) -> list[int]:
    return store._run(flows.mint_seqs(store._state, n, above))


def stop_cleanly(store: MongoStore) -> None:
    """What `close()` does before closing the client (the client is shared here)."""
    store._drive(flows.release_lease(store._state))


def test_instances_started_and_stopped_past_the_node_count_never_share_a_seq(shared, db_name, figures):
    """1,100 store instances over the database's life (more than the 1,024 nodes), each
    committing an emit in the very same millisecond: some stop cleanly, some just vanish
    (their lease expires), and every so often the survivors are long gone. No seq repeats,
    and acking each entry by its seq alone, from an instance that never saw it, pulls
    exactly that entry and no other."""
    clocks = Clocks()
    seqs: dict[int, str] = {}
    instances = 1_100
    for i in range(instances):
        store = clocks.install(MongoStore(shared, db_name))
        exe = Execution(id=f"x{i}", definition_id="d")
        (seq,) = store.commit(exe, [(None, Event(kind="E", data={"i": i}))])
        assert seq not in seqs, f"instance {i} minted {seq}, already minted for {seqs.get(seq)}"
        seqs[seq] = exe.id
        if i % 3 == 0:
            stop_cleanly(store)  # the rest vanish without a word, as a crash would leave them
        if i % 300 == 299:
            clocks.wall += LEASE_TTL_S + 1  # the vanished ones' leases run out
    nodes = {node_of(s) for s in seqs}
    assert len(nodes) == NODES  # every node was used, several by more than one instance
    cold = clocks.install(MongoStore(shared, db_name))
    for seq, owner in list(seqs.items())[:50] + list(seqs.items())[-50:]:
        cold.ack_outbox(seq)
        assert not [e for e in cold.pending_outbox() if e.seq == seq]
        left = shared[db_name]["harel_executions"].find_one({"_id": owner})
        assert left is not None and left["outbox"] == []
    assert len(cold.pending_outbox()) == instances - 100  # nobody else's entry went with them
    figures.set(instances=instances, distinct_seqs=len(seqs), instances_on_a_reused_node=instances - len(nodes))


def test_live_instances_minting_at_once_in_one_millisecond_stay_apart(shared, db_name, figures):
    """48 instances alive together, each in its own thread minting 300 seqs with the same
    frozen clock: 14,400 seqs, all distinct; each instance on a node of its own."""
    clocks = Clocks()
    stores = [clocks.install(MongoStore(shared, db_name)) for _ in range(48)]
    out: list[list[int]] = [[] for _ in stores]

    def run(k: int) -> None:
        for _ in range(30):
            out[k] += mint(stores[k], 10)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [s for batch in out for s in batch]
    assert len(every) == len(set(every)) == 48 * 300
    assert len({node_of(batch[0]) for batch in out}) == 48
    for batch in out:
        assert batch == sorted(batch) and len({node_of(s) for s in batch}) == 1
    figures.set(instances=len(stores), distinct_seqs=len(every))


def test_an_instance_that_outlives_its_lease_keeps_minting_unique_seqs(shared, db_name):
    """A holder paused past its lease's expiry is taken over by a newcomer on the same node.
    Both go on minting in the same frozen millisecond: the newcomer starts above the range
    the old holder may still use, and the old holder, at its next extension, finds the node
    gone and takes another one. Nothing repeats."""
    clocks = Clocks()
    old = clocks.install(MongoStore(shared, db_name))
    first = mint(old, 5)
    node = node_of(first[0])
    clocks.wall += LEASE_TTL_S + 1  # `old` is paused: it renews nothing
    # the node counter sends the newcomer elsewhere first: point it at the paused node
    shared[db_name]["harel_counters"].update_one({"_id": "harel_beanie:node"}, {"$set": {"n": node}})
    new = clocks.install(MongoStore(shared, db_name))
    taken = mint(new, 5)
    assert node_of(taken[0]) == node
    assert min(taken) >> MS_SHIFT >= old._state.mint.lease.hi  # above all the old range
    more_old = mint(old, 5)  # still inside its old range: unique all the same
    clocks.ms += LEASE_SPAN_MS  # the old holder needs an extension now...
    after = mint(old, 5)
    assert node_of(after[0]) != node  # ...which tells it the node is gone: it moved
    every = first + taken + more_old + after + mint(new, 5)
    assert len(every) == len(set(every))


@pytest.mark.parametrize(
    "clock",
    ["frozen", "stepped back an hour", "before the seq epoch", "jumping a day ahead and back"],
)
def test_any_clock_keeps_one_instance_strictly_increasing(shared, db_name, clock):
    """Whatever one instance's clock does, its seqs strictly increase, are positive int64s,
    and a frozen clock carries past the 4,096 seqs of one millisecond (and past the lease's
    end, extending it) instead of repeating."""
    ticks = {
        "frozen": lambda k: FROZEN_MS,
        "stepped back an hour": lambda k: FROZEN_MS - (3_600_000 if k > 20 else 0),
        "before the seq epoch": lambda k: -5_000_000 + k,
        "jumping a day ahead and back": lambda k: FROZEN_MS + (86_400_000 if k % 7 == 3 else 0),
    }[clock]
    k = [0]

    def ms() -> int:
        k[0] += 1
        return int(ticks(k[0]))

    store = Clocks().install(MongoStore(shared, db_name), ms)
    seqs = []
    for _ in range(60):
        seqs += mint(store, 200)  # 12,000: three milliseconds' worth on a frozen clock
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert all(0 < s < 2**63 for s in seqs)


def test_a_node_reused_by_a_machine_whose_clock_is_behind_starts_above_the_last_holder(shared, db_name):
    """Skew between machines: a holder whose clock runs a day ahead stops; the next holder
    of its node, with a clock a day behind that, still mints above every seq the first one
    could have minted (the lease starts at the recorded end of the last one)."""
    ahead, behind = Clocks(), Clocks()
    ahead.ms += 86_400_000
    a = ahead.install(MongoStore(shared, db_name))
    minted = mint(a, 100)
    stop_cleanly(a)
    node = node_of(minted[0])
    shared[db_name]["harel_counters"].update_one({"_id": "harel_beanie:node"}, {"$set": {"n": node}})
    b = behind.install(MongoStore(shared, db_name))
    later = mint(b, 100)
    assert node_of(later[0]) == node and min(later) > max(minted)


def test_seqs_stay_above_harels_own_counters(shared, db_name):
    """In a database harel's MongoStore wrote, its `outbox` and `spawn` counters issued the
    pending entries' seqs: a lease starts above both, even for a clock before 2024."""
    counters = shared[db_name]["harel_counters"]
    counters.insert_many([{"_id": "outbox", "n": 7 << MS_SHIFT}, {"_id": "spawn", "n": 12 << MS_SHIFT}])
    store = Clocks().install(MongoStore(shared, db_name), lambda: -10_000)
    assert min(mint(store, 50)) > 12 << MS_SHIFT


def test_every_node_held_by_a_live_instance_is_refused_by_name(shared, db_name):
    """With all 1,024 nodes leased to instances still alive, one more instance does not
    share one: it is refused, saying so."""
    clocks = Clocks()
    leases = shared[db_name]["harel_counters"]
    leases.insert_many(
        [
            {"_id": lease_id(n), "node": n, "owner": "alive", "hi": FROZEN_MS + 60_000, "expires": clocks.wall + 60}
            for n in range(NODES)
        ]
    )
    store = clocks.install(MongoStore(shared, db_name))
    with pytest.raises(RuntimeError, match="all 1024 seq nodes"):
        mint(store)
    clocks.wall += 61  # they stop renewing: the nodes are free again
    assert node_of(mint(store)[0]) in range(NODES)


def test_lease_writes_and_reads_are_majority_whatever_the_store_concerns(mongo_url, db_name):
    """A lease must survive a failover (Rule 7): its writes go at w:majority with the
    journal and its reads at majority, even on a store configured with w:1."""
    from pymongo.write_concern import WriteConcern

    rec = Recorder()
    store = MongoStore(pymongo.MongoClient(mongo_url, event_listeners=[rec]), db_name, write_concern=WriteConcern(w=1))
    store.init()
    rec.clear()
    mint(store)
    store.close()
    seen = [(name, cmd) for name, cmd in rec.take() if cmd.get(name) == "harel_counters"]
    assert {name for name, _ in seen} >= {"findAndModify", "find", "insert", "update"}
    for name, cmd in seen:
        if name == "find":
            assert cmd["readConcern"] == {"level": "majority"}, cmd
        else:
            assert cmd["writeConcern"] == {"w": "majority", "j": True}, cmd
