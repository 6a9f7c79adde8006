"""What a deployment meets over months, beyond one write: a lost reply followed by other
writers, purges that late, retried or duplicated writes must not undo, an id reused after a
purge, and relays that hold a purged execution's work. Both stores, on the real server.

Faults are injected into the store's own calls (the `_call` of a subclass), so each case
happens exactly where it must: a write applied with its reply lost, and before the store
reads back, something else happens on the server.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import pymongo
import pytest
from harel import DurableRunner
from harel.engine.execution import Execution
from harel.engine.store.base import StoreConflict, TimerOp
from harel.spec.states import Event
from pymongo.errors import AutoReconnect, ConnectionFailure, DuplicateKeyError

from harel_beanie import CommitOutcomeUnknown, MongoStore
from harel_beanie.core import calls
from harel_beanie.core.commit import COMMIT_TOKENS
from harel_beanie.core.counting import COUNTED, COUNTED_SEQ, DIRTY
from harel_beanie.deploy.loader import load_models
from tests.support.both import BlockingAsyncStore, make_store

COMMIT_UPDATE = lambda c: (
    isinstance(c, calls.UpdateOne) and isinstance(c.update, dict) and "commit_tokens" in c.update.get("$push", {})
)  # noqa: E731
CREATION = lambda c: isinstance(c, calls.InsertOne) and c.target == "executions"  # noqa: E731


class Meddle:
    """Applies the first call matching `match`, then runs `meanwhile` (another writer, a
    purge), then tells the store the reply was lost."""

    def __init__(self, match: Callable[[calls.Call], bool], meanwhile: Callable[[], None]) -> None:
        self.match, self.meanwhile, self.fired = match, meanwhile, False

    def intercept(self, c: calls.Call) -> bool:
        if self.fired or not self.match(c):
            return False
        self.fired = True
        return True


class MeddledSync(MongoStore):
    meddle: Optional[Meddle] = None

    def _call(self, c: calls.Call) -> Any:
        if self.meddle is not None and self.meddle.intercept(c):
            super()._call(c)
            self.meddle.meanwhile()
            raise AutoReconnect("injected: the reply was lost")
        return super()._call(c)


def _tombstone_keys(doc: Any) -> set[str]:
    """A tombstone's fields but the counts' bookkeeping (`harel_beanie.core.counting`), which a
    tombstone carries until the next fold counts it."""
    return set(doc) - {DIRTY, COUNTED, COUNTED_SEQ}


@pytest.fixture
def coll(client: pymongo.MongoClient[Any], db_name: str) -> Any:
    return client[db_name]["harel_executions"]


@pytest.fixture
def other(mongo_url: str, db_name: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Another writer: the sync store, or the async one behind its blocking facade."""
    store = make_store(getattr(request, "param", "sync"), mongo_url, db_name)
    yield store
    store.shutdown() if isinstance(store, BlockingAsyncStore) else store.close()


@pytest.fixture
def meddled(mongo_url: str, db_name: str) -> Iterator[MeddledSync]:
    store = MeddledSync(pymongo.MongoClient(mongo_url), db_name)
    yield store
    store.close()


def commits_by_others(other: Any, exe_id: str, n: int) -> Callable[[], None]:
    def run() -> None:
        for i in range(n):
            exe = other.load(exe_id)
            other.commit(exe, [(None, Event(kind=f"Other{i}"))])

    return run


@pytest.mark.parametrize("others", [1, COMMIT_TOKENS - 1])
def test_a_lost_reply_followed_by_other_writers_is_reported_landed(meddled, other, coll, others):
    """The promise of docs/design.md, "Durability": a commit whose reply was lost is reported as landed when it
    landed, even if other writers committed after it before the read-back (up to the
    `COMMIT_TOKENS` - 1 it remembers): the caller gets its seqs, not a conflict."""
    meddled.commit(Execution(id="w", definition_id="d"), [])
    exe = meddled.load("w")
    meddled.meddle = Meddle(COMMIT_UPDATE, commits_by_others(other, "w", others))
    seqs = meddled.commit(exe, [(None, Event(id="mine", kind="Mine"))], processed_event_id="in")
    doc = coll.find_one({"_id": "w"})
    assert doc["version"] == 2 + others and exe.version == 2
    assert [e["seq"] for e in doc["outbox"]][:1] == seqs  # ours, once, first
    assert len(doc["outbox"]) == 1 + others


def test_past_the_remembered_commits_a_landed_commit_is_of_unknown_outcome(meddled, other, coll):
    """The exact rule's edge: with `COMMIT_TOKENS` commits by others between the lost reply
    and the read-back, the commit's token is out of the window, but the event it consumed is
    marked processed: the store cannot tell whether it landed and says so,
    `CommitOutcomeUnknown` (a connection failure), never `StoreConflict`, which would say it
    was not applied; harel then redelivers the event, which the dedupe window recognises.
    Nothing is applied twice."""
    meddled.commit(Execution(id="e", definition_id="d"), [])
    exe = meddled.load("e")
    meddled.meddle = Meddle(COMMIT_UPDATE, commits_by_others(other, "e", COMMIT_TOKENS))
    with pytest.raises(CommitOutcomeUnknown) as err:
        meddled.commit(exe, [(None, Event(id="mine", kind="Mine"))], processed_event_id="in")
    assert isinstance(err.value, ConnectionFailure) and not isinstance(err.value, StoreConflict)
    assert other.is_processed("e", "in")
    assert len(coll.find_one({"_id": "e"})["outbox"]) == 1 + COMMIT_TOKENS


def test_a_creation_whose_reply_was_lost_and_that_was_purged_is_landed_and_stays_purged(meddled, other, coll):
    """The creation lands, its reply is lost, another worker purges it before the read-back:
    the creator learns its commit landed (its token is buried in the tombstone) and re-sends
    nothing; the execution stays purged, its emit and timer never pending again."""

    def purge() -> None:
        assert other.purge("p", 1) is True

    meddled.meddle = Meddle(CREATION, purge)
    exe = Execution(id="p", definition_id="d")
    seqs = meddled.commit(exe, [(None, Event(kind="Once"))], timers=(TimerOp("schedule", "T", 5.0),))
    assert len(seqs) == 1 and exe.version == 1
    assert _tombstone_keys(coll.find_one({"_id": "p"})) == {"_id", "tomb", "part"}  # the tombstone keeps the shard key
    assert other.load("p") is None and other.pending_outbox() == [] and other.due_timers(10.0) == []


def test_a_duplicated_or_late_creation_never_undoes_a_purge(mongo_url, db_name, coll, other):
    """The creation's insert, as the driver or the network may send it again, arriving after
    the purge: refused by the tombstone's id. A stale commit of the purged copy and an
    `append_trace` to it find nothing to change."""
    store = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    exe = Execution(id="d1", definition_id="d")
    sent: list[dict[str, Any]] = []
    real = store._call

    def spy(c: calls.Call) -> Any:
        if CREATION(c):
            sent.append(dict(c.document))  # type: ignore[union-attr]
        return real(c)

    store._call = spy  # type: ignore[method-assign]
    store.commit(exe, [(None, Event(kind="E"))], spawns=(("d1:c", "R", {}),))
    stale = store.load("d1")
    assert store.purge("d1", 1) is True
    with pytest.raises(DuplicateKeyError):
        coll.insert_one(sent[0])  # the very insert, again
    with pytest.raises(StoreConflict):
        store.commit(stale, [(None, Event(kind="Late"))])
    store.append_trace("d1", {"late": True})
    assert _tombstone_keys(coll.find_one({"_id": "d1"})) == {"_id", "tomb", "part"}  # the tombstone keeps the shard key
    assert store.pending_outbox() == [] and store.pending_spawns() == [] and store.load("d1") is None
    assert store.ids_with_prefix("d1") == [] and [s.id for s in store.list_executions().items] == []
    store.close()


def test_a_purged_id_is_reused_only_through_a_new_create(mongo_url, db_name, coll, definitions):
    """harel's `create` with an id purged before makes a new execution under it (the
    tombstone gives way); the purged incarnation's late creation insert still cannot
    overwrite it, and purging the new one buries both incarnations."""
    store = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    runner = DurableRunner(store, definitions)
    first = runner.create("Parcel", execution_id="parcel-1")
    first_insert = {**coll.find_one({"_id": "parcel-1"}), "_id": "parcel-1"}
    runner.terminate("parcel-1")  # harel purges only finished executions
    assert runner.purge("parcel-1") is True
    again = runner.create("Parcel", execution_id="parcel-1")
    assert again.version == 1 and store.load("parcel-1") is not None
    with pytest.raises(DuplicateKeyError):
        coll.insert_one(first_insert)  # the first incarnation's creation, landing very late
    runner.process("parcel-1", Event(kind="Pay"))
    assert store.load("parcel-1").context["steps"] == 1
    runner.terminate("parcel-1")
    assert runner.purge("parcel-1") is True
    assert len(coll.find_one({"_id": "parcel-1"})["tomb"]["buried"]) == 2
    assert first.id == again.id
    store.close()


@pytest.fixture(scope="module")
def definitions() -> dict:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    return {**load_models(), **load_models(root / "models" / "bench")}


class PurgeDuringRelay(MongoStore):
    """A store whose relay read is followed, before the relay acts, by a purge of `victim`
    through another store (the race between a relaying worker and an operator's purge)."""

    victim: str = ""
    purger: Any = None
    armed: str = ""

    def pending_spawns(self, **kw: Any) -> list[Any]:
        out = super().pending_spawns(**kw)
        self._purge_if("spawns", out)
        return out

    def pending_outbox(self, **kw: Any) -> list[Any]:
        out = super().pending_outbox(**kw)
        self._purge_if("outbox", out)
        return out

    def _purge_if(self, what: str, entries: list[Any]) -> None:
        if self.armed == what and entries:
            self.armed = ""
            victim = self.purger.load(self.victim)
            assert self.purger.purge(self.victim, victim.version) is True


@pytest.mark.parametrize("what", ["spawns", "outbox"])
def test_a_relay_holding_a_purged_executions_work_finishes_it_and_resurrects_nothing(
    mongo_url, db_name, coll, definitions, other, what
):
    """harel's own relay (DurableRunner) reads pending spawns or outbox entries, then the
    execution they belong to (the parent of a spawn, the target of an entry) is purged
    before it acts. The relay finishes what it held without an error; the purged execution
    stays a tombstone, and nothing is left pending anywhere."""
    store = PurgeDuringRelay(pymongo.MongoClient(mongo_url), db_name)
    store.purger = other
    runner = DurableRunner(store, definitions)
    # creating an order invokes its payment (a pending spawn, relayed inline); the payment
    # reports back with `Returned` (an outbox entry addressed to the order)
    store.victim, store.armed = "order-1", what
    with pytest.raises(AssertionError):  # harel's create reloads what it made: purged meanwhile
        runner.create("Order", context={"order_id": "A-1", "amount": 1.0, "lines": ["SKU-1"]}, execution_id="order-1")
    assert not store.armed, "the race did not happen"
    for _ in range(3):
        runner.fire_due_timers()
        runner.recover("Payment")
    assert _tombstone_keys(coll.find_one({"_id": "order-1"})) == {
        "_id",
        "tomb",
        "part",
    }  # the tombstone keeps the shard key
    assert store.pending_outbox() == [] and store.pending_spawns() == []
    assert store.load("order-1") is None
    store.close()
