"""What a claim costs the server with a backlog queued, counted on the wire (no timing): the
windows of the claim key it reads (`harel_beanie.transport.claim_walk`, Rule 3 of
`harel_beanie.transport.queues`), the documents each holds, the index the server answers
them from, and the round trips of a claim of k groups (Rule 8) and of the prefetch that
hands them to a worker's next claims (`harel_beanie.transport.prefetch`).

On SecantusDB `limit` does not bound the work and explain is synthesised (documents examined
= results for an index scan), so the documents a read costs are counted as the documents its
filter matches (`count_documents` of exactly the filter the claim sent), and the plan is
asserted to be a scan of `hb_claim`, never of the collection: before the windows a claim read
every due group (1.1 s per claim with 10,000 queued, bench/RESULTS.md).
"""

from __future__ import annotations

import copy
from typing import Any

import pymongo
from harel.spec.states import Event

from harel_beanie.core import calls
from harel_beanie.transport import AsyncMongoTransport, MongoTransport
from harel_beanie.transport.claim_walk import READ
from tests.support.wire import Recorder

QS = "harel_hb_queues"
QUEUED = 10_000
#: the most documents a window may hold after the first claim (the walk sizes windows to
#: `TARGET`; a window narrows after one that was too full, so this leaves it room)
WINDOW_BOUND = READ


class Replies:
    """The calls a transport made and the replies it got, in order."""

    def __init__(self, t: Any) -> None:
        self.seen: list[tuple[calls.Call, Any]] = []
        inner = t._call

        def call(c: calls.Call) -> Any:
            reply = inner(c)
            self.seen.append((c, reply))
            return reply

        t._call = call

    def take(self) -> list[tuple[calls.Call, Any]]:
        seen, self.seen = self.seen, []
        return seen


def _queue(t: MongoTransport, db: Any, n: int) -> None:
    """`n` groups of one message each, as a burst of publishes leaves them: the first three
    published for real, the rest copies of the last with its key moved on by a millisecond
    each (10,000 publishes take longer than this test should)."""
    for i in range(3):
        t.publish(f"g{i:05d}", Event(kind="e"))
    template = db[QS].find_one({"_id": "g00002"})
    docs = []
    for i in range(3, n):
        doc = copy.deepcopy(template)
        doc["_id"] = f"g{i:05d}"
        doc["available_at"] = template["available_at"] + (i - 2) * 0.001
        doc["part"] = t.partitions.part_of(doc["_id"])
        docs.append(doc)
    db[QS].insert_many(docs)


def _plan_stages(plan: dict[str, Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "stage" in node:
                out.append((node["stage"], node.get("indexName")))
            for key in ("queryPlan", "inputStage", "inputStages", "winningPlan"):
                if key in node:
                    walk(node[key])
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(plan)
    return out


def test_a_claim_with_10000_groups_queued_reads_a_window_from_the_index(mongo_url: str, db_name: str) -> None:
    """After the first claim of a process (which reads the due groups whole, once), every
    claim is one window read and one conditional lease; the window holds at most
    `WINDOW_BOUND` of the 10,000 queued groups, the server plans it on `hb_claim`, and the
    groups come in publish order (fresh groups: Rule 3)."""
    rec = Recorder()
    client = pymongo.MongoClient(mongo_url, event_listeners=[rec])
    db = client[db_name]
    t = MongoTransport(client, db_name, clock=lambda: 1_000_000.0)
    t.init()
    _queue(t, db, QUEUED)
    replies = Replies(t)
    first = t.claim("w", 30)
    assert first is not None and first.group_id == "g00000"
    replies.take()
    rec.clear()
    for i in range(1, 31):
        lease = t.claim("w", 30)
        assert lease is not None and lease.group_id == f"g{i:05d}"  # publish order
        sent = [(name, cmd) for name, cmd in rec.take() if name in ("find", "update", "findAndModify")]
        assert [name for name, _ in sent] == ["find", "update"], sent
        (read, docs), _lease = replies.take()
        assert isinstance(read, calls.Find) and set(read.filter) == {"available_at", "pending"}, read
        held = db[QS].count_documents(read.filter)
        assert held <= WINDOW_BOUND and len(docs) <= held + 1, (i, read.filter, held)  # + the one leased
        t.ack(lease)
        rec.clear()
        replies.take()
    plan = db.command("explain", {"find": QS, "filter": read.filter, "sort": {"available_at": 1, "_id": 1}})
    stages = _plan_stages(plan["queryPlanner"]["winningPlan"])
    assert ("IXSCAN", "hb_claim") in stages and not any(s == "COLLSCAN" for s, _ in stages), stages
    t.close()


def test_the_served_band_is_read_in_windows_too(mongo_url: str, db_name: str) -> None:
    """Groups claimed before and still holding messages (their key the time of their last ack)
    are read in windows of their band as the fresh ones are: with 2,000 of them due and no
    fresh group, each claim's reads hold at most `WINDOW_BOUND` documents."""
    clock = [1_000_000.0]
    client = pymongo.MongoClient(mongo_url)
    db = client[db_name]
    t = MongoTransport(client, db_name, clock=lambda: clock[0])
    t.init()
    _queue(t, db, 2_000)
    # every group served once: its key moves to the time of its ack, a millisecond apart
    db[QS].update_many({}, [{"$set": {"available_at": {"$add": [clock[0] - 10.0, {"$rand": {}}]}}}])
    replies = Replies(t)
    assert t.claim("w", 30) is not None  # the first claim of the process reads the band whole
    replies.take()
    for _ in range(20):
        lease = t.claim("w", 30)
        assert lease is not None
        for c, _reply in replies.take():
            if isinstance(c, calls.Find):
                assert db[QS].count_documents(c.filter) <= WINDOW_BOUND, c.filter
        t.ack(lease)
        replies.take()
    t.close()


def test_a_claim_of_k_groups_is_two_round_trips(mongo_url: str, db_name: str) -> None:
    """`claim_many(k)`: one window read and one bulk write of k conditional leases; k
    distinct groups, first in claim order. When another claimer leased one of them between
    the read and the write, one more read says which the claim won, and the claim leases the
    next group read in its place."""
    rec = Recorder()
    client = pymongo.MongoClient(mongo_url, event_listeners=[rec])
    clock = [1_000.0]  # a second between publishes: windows the same in every run
    t = MongoTransport(client, db_name, clock=lambda: clock[0])
    other = MongoTransport(pymongo.MongoClient(mongo_url), db_name, clock=lambda: clock[0])
    for i in range(12):
        clock[0] += 1.0
        t.publish(f"g{i:02d}", Event(kind=f"e{i}"))
    rec.clear()
    leases = t.claim_many("w", 30, 5)
    assert [x.group_id for x in leases] == [f"g{i:02d}" for i in range(5)]
    assert [name for name, _ in rec.take() if name != "endSessions"] == ["find", "update"]

    # another claimer takes the next group between this claim's read and its write
    inner = t._call
    raced: list[str] = []

    def racing(c: calls.Call) -> Any:
        reply = inner(c)
        if isinstance(c, calls.Find) and c.target == "queues" and not raced:
            lease = other.claim("o", 30)
            assert lease is not None
            raced.append(lease.group_id)
        return reply

    t._call = racing  # type: ignore[method-assign]
    leases = t.claim_many("w", 30, 4)
    assert raced == ["g05"]
    assert [x.group_id for x in leases] == ["g06", "g07", "g08", "g09"]  # g05 lost, g09 in its place
    assert [name for name, _ in rec.take() if name != "endSessions"] == ["find", "update", "find", "update"]
    t.close()
    other.close()


async def test_prefetch_hands_the_groups_a_claim_leased_to_the_next_claims(mongo_url: str, db_name: str) -> None:
    """With `prefetch=4` the first claim leases four groups in two round trips and the next
    three claims are answered without a command; a kept lease goes only to a claim whose
    `min_priority` its group meets; `close()` gives back the kept ones, claimable at once."""
    rec = Recorder()
    t = AsyncMongoTransport(pymongo.AsyncMongoClient(mongo_url, event_listeners=[rec]), db_name, prefetch=4)
    await t.init()
    for i in range(6):
        await t.publish(f"g{i}", Event(kind=f"e{i}"))
    rec.clear()
    first = await t.claim("w", 30)
    assert first is not None and first.group_id == "g0"
    assert [name for name, _ in rec.take() if name in ("find", "update")] == ["find", "update"]
    assert await t.claim("w", 30, min_priority=1) is None  # no kept lease suits; nothing due meets it
    rec.clear()
    second = await t.claim("w", 30)
    assert second is not None and second.group_id == "g1"
    assert [name for name, _ in rec.take() if name in ("find", "update")] == []  # from the kept ones
    await t.ack(first)
    await t.close()  # g2 and g3 were kept: given back

    again = MongoTransport(pymongo.MongoClient(mongo_url), db_name)
    got = sorted(x.group_id for x in again.claim_many("w2", 30, 10))
    assert got == ["g2", "g3", "g4", "g5"]  # g1 is still leased to the first worker
    again.close()


def test_groups_tied_on_their_key_are_all_claimed_in_id_order(mongo_url: str, db_name: str) -> None:
    """A clock that does not move gives every fresh group the same key: more of them than a
    read returns (`READ`) are still all claimed, in `_id` order, one each, and nothing
    after (the walk reads a tied key again with room for them all)."""
    client = pymongo.MongoClient(mongo_url)
    t = MongoTransport(client, db_name, clock=lambda: 5_000.0)
    n = READ * 2 + 5
    for i in range(n):
        t.publish(f"t{i:04d}", Event(kind="e"))
    claimed = []
    while (lease := t.claim("w", 30)) is not None:
        claimed.append(lease.group_id)
        t.ack(lease)
    assert claimed == [f"t{i:04d}" for i in range(n)]
    got = t.claim_many("w", 30, 5)
    assert got == []
    t.close()


def test_a_claim_finds_the_one_group_it_may_take_behind_a_full_reply_of_others(mongo_url: str, db_name: str) -> None:
    """Groups the claim may not take (below its `min_priority`) fill more than a read's reply
    ahead of the one it may: the claim reads on past them, on its first claim and on a later one."""
    client = pymongo.MongoClient(mongo_url)
    t = MongoTransport(client, db_name, clock=lambda: 5_000.0)
    for i in range(READ * 2 + 5):
        t.publish(f"a{i:04d}", Event(kind="e"))
    t.publish("z-high", Event(kind="e"), priority=2)
    t.publish("z-high-2", Event(kind="e"), priority=2)
    first = t.claim("w", 30, min_priority=2)
    assert first is not None and first.group_id == "z-high"
    again = t.claim("w", 30, min_priority=2)
    assert again is not None and again.group_id == "z-high-2"
    assert t.claim("w", 30, min_priority=2) is None
    t.close()
