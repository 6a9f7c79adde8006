"""The classifier of tests/sharding/targeting.py, on synthetic commands: each of MongoDB's
routing rules it restates, and the shapes the store and the transport send."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from tests.sharding.targeting import ALL_SHARDS, ONE_SHARD, PARTITION_SCOPED, UNSHARDED, classify, classify_event

DB, PREFIX = "app", "harel"
EXECUTIONS, QUEUES, OVERFLOW = "harel_executions", "harel_hb_queues", "harel_hb_overflow"
T = 1_700_000_000.0


def one(name: str, command: dict, database: str = DB):
    results = classify(name, command, database, DB, PREFIX)
    assert len(results) == 1, results
    return results[0]


def test_the_claim_on_main_today_is_a_broadcast_and_breaks_the_findandmodify_rule():
    """The claim as the transport sends it before partitions: no shard key at all."""
    claim = {
        "findAndModify": QUEUES,
        "query": {"pending": {"$gt": 0}, "available_at": {"$lte": T}, "priority": {"$gte": 0}},
        "sort": {"available_at": 1, "priority": 1},
        "update": {"$set": {"token": "t"}},
    }
    result = one("findAndModify", claim)
    assert result.kind == ALL_SHARDS
    assert result.violations and "findAndModify" in result.violations[0] and result.flagged


def test_the_claim_naming_its_partition_reaches_one_shard():
    claim = {
        "findAndModify": QUEUES,
        "query": {"part": 3, "pending": {"$gt": 0}, "available_at": {"$lte": T}, "priority": {"$gte": 0}},
        "update": {"$set": {"token": "t"}},
    }
    result = one("findAndModify", claim)
    assert (result.kind, result.violations, result.flagged) == (ONE_SHARD, [], False)


@pytest.mark.parametrize("part", [{"$in": [3]}, {"$in": [3, 4]}, {"$gte": 3}])
def test_a_claim_over_a_set_of_partitions_is_no_equality(part):
    """A one-element `$in` targets its partition but is not the equality the rule asks for."""
    result = one("findAndModify", {"findAndModify": QUEUES, "query": {"part": part}, "remove": True})
    assert result.violations
    assert result.kind == (ALL_SHARDS if "$gte" in part else PARTITION_SCOPED)


def test_an_update_by_id_alone_on_executions_is_allowed_but_broadcast():
    update = {"update": EXECUTIONS, "updates": [{"q": {"_id": "order-1"}, "u": {"$set": {"v": 2}}}]}
    result = one("update", update)
    assert result.kind == ALL_SHARDS and result.violations == [] and result.flagged


def test_an_update_by_id_and_part_reaches_one_shard():
    update = {"update": EXECUTIONS, "updates": [{"q": {"_id": "order-1", "part": 5, "version": 3}, "u": {}}]}
    result = one("update", update)
    assert (result.kind, result.violations) == (ONE_SHARD, [])


def test_every_statement_of_an_update_is_judged():
    update = {
        "update": EXECUTIONS,
        "updates": [
            {"q": {"_id": "a", "part": 1}, "u": {}, "upsert": True},
            {"q": {"_id": "b"}, "u": {}, "upsert": True},
            {"q": {"status": "RUNNING"}, "u": {}, "multi": False},
            {"q": {"status": "RUNNING"}, "u": {}, "multi": True},
            {"q": {"part": {"$in": [1, 2]}, "pending": True}, "u": {}, "multi": True},
        ],
    }
    results = classify("update", update, DB, DB, PREFIX)
    assert [r.kind for r in results] == [ONE_SHARD, ALL_SHARDS, ALL_SHARDS, ALL_SHARDS, PARTITION_SCOPED]
    assert [len(r.violations) for r in results] == [0, 1, 1, 0, 0]
    assert "upsert" in results[1].violations[0] and "updates[1]" in results[1].violations[0]
    assert "single-document update" in results[2].violations[0]


def test_deletes_one_and_many():
    delete = {
        "delete": OVERFLOW,
        "deletes": [
            {"q": {"g": "order-1"}, "limit": 1},
            {"q": {"_id": "x"}, "limit": 1},
            {"q": {"part": 2, "g": "order-1"}, "limit": 1},
            {"q": {"g": "order-1"}, "limit": 0},
        ],
    }
    results = classify("delete", delete, DB, DB, PREFIX)
    assert [r.kind for r in results] == [ALL_SHARDS, ALL_SHARDS, ONE_SHARD, ALL_SHARDS]
    assert [bool(r.violations) for r in results] == [True, False, False, False]


def test_reads_by_partition_are_scoped_and_by_full_key_one_shard():
    family = {"part": 4, "pending": True, "$or": [{"_id": "o"}, {"_id": {"$gte": "o:", "$lt": "o;"}}]}
    assert one("find", {"find": EXECUTIONS, "filter": family}).kind == PARTITION_SCOPED
    assert one("find", {"find": EXECUTIONS, "filter": {"_id": "o", "part": {"$eq": 4}}}).kind == ONE_SHARD
    assert one("find", {"find": EXECUTIONS, "filter": {"$and": [{"_id": "o"}, {"part": 4}]}}).kind == ONE_SHARD
    assert one("find", {"find": EXECUTIONS, "filter": {"_id": "o", "part": {"$in": [4]}}}).kind == PARTITION_SCOPED
    assert one("find", {"find": EXECUTIONS, "filter": {"_id": re.compile("^o"), "part": 4}}).kind == PARTITION_SCOPED
    assert one("find", {"find": EXECUTIONS, "filter": {"_id": "o"}}).kind == ALL_SHARDS
    assert one("count", {"count": QUEUES, "query": {"part": 1}}).kind == ONE_SHARD
    assert one("distinct", {"distinct": EXECUTIONS, "key": "status", "query": {}}).kind == ALL_SHARDS


def test_an_aggregate_is_judged_by_its_first_match():
    first = {"aggregate": QUEUES, "pipeline": [{"$match": {"part": {"$in": [0, 1]}}}, {"$group": {"_id": None}}]}
    assert one("aggregate", first).kind == PARTITION_SCOPED
    later = {"aggregate": QUEUES, "pipeline": [{"$group": {"_id": "$part"}}, {"$match": {"_id": 1}}]}
    assert one("aggregate", later).kind == ALL_SHARDS


def test_an_insert_must_carry_the_shard_key():
    good = one("insert", {"insert": EXECUTIONS, "documents": [{"_id": "a", "part": 3}, {"_id": "b", "part": 9}]})
    assert (good.kind, good.violations) == (ONE_SHARD, [])
    bad = one("insert", {"insert": QUEUES, "documents": [{"_id": "a", "part": 3}, {"_id": "b"}]})
    assert bad.violations == [f"insert without part: documents[1] of {QUEUES}"]


def test_collections_outside_the_plan_and_other_commands():
    assert one("findAndModify", {"findAndModify": "harel_counters", "query": {"_id": "x"}}).kind == UNSHARDED
    assert one("find", {"find": "harel_hb_samples", "filter": {}}).violations == []
    assert classify("find", {"find": EXECUTIONS, "filter": {}}, "admin", DB, PREFIX) == []
    for name in ("getMore", "hello", "createIndexes", "listIndexes", "endSessions", "ping"):
        assert classify(name, {name: EXECUTIONS}, DB, DB, PREFIX) == []
    assert classify("aggregate", {"aggregate": 1, "pipeline": [{"$changeStream": {}}]}, DB, DB, PREFIX) == []


def test_a_recorded_event_is_classified_by_its_fields():
    event = SimpleNamespace(command_name="find", command={"find": QUEUES, "filter": {"part": 2}}, database_name=DB)
    assert [r.kind for r in classify_event(event, DB, PREFIX)] == [ONE_SHARD]


def test_each_operation_names_the_partitions_it_can_reach():
    """What the audit holds a worker's reads to (`Classified.parts`): the values the filter
    allows `part`, every condition on it together; None where it allows any, or for a
    collection outside the plan."""
    every = list(range(16))
    assert one("find", {"find": EXECUTIONS, "filter": {"part": {"$in": every}}}).parts == frozenset(every)
    assert one("find", {"find": EXECUTIONS, "filter": {"part": {"$in": every}}}).kind == PARTITION_SCOPED
    assert one("find", {"find": EXECUTIONS, "filter": {"part": {"$eq": 4}, "_id": "o"}}).parts == {4}
    both = {"$and": [{"part": {"$in": [1, 2, 3]}}, {"part": {"$in": [2, 3, 9]}}]}
    assert one("find", {"find": EXECUTIONS, "filter": both}).parts == {2, 3}
    assert one("find", {"find": EXECUTIONS, "filter": {"part": {"$gte": 3}}}).parts is None
    assert one("find", {"find": EXECUTIONS, "filter": {"part": {"$in": [0, None]}}}).parts == {0, None}
    assert one("find", {"find": EXECUTIONS, "filter": {}}).parts is None
    assert one("find", {"find": "harel_hb_counts", "filter": {"_id": 3}}).parts is None
    inserted = one("insert", {"insert": EXECUTIONS, "documents": [{"_id": "a", "part": 3}, {"_id": "b", "part": 9}]})
    assert inserted.parts == {3, 9}
