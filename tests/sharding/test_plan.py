"""The shard plan's check (harel_beanie.store.sharding): mongos detection, the live keys read
from `config.collections` records, and one message per collection sharded against the plan."""

from __future__ import annotations

import pytest

from harel_beanie.core.errors import ShardPlanError
from harel_beanie.store.sharding import (
    check_plan,
    config_filter,
    format_key,
    is_mongos,
    live_keys,
    plan_collections,
    plan_notes,
    plan_problems,
)

DB, PREFIX = "app", "harel"
EXECUTIONS, QUEUES, OVERFLOW = "harel_executions", "harel_hb_queues", "harel_hb_overflow"
PLANNED = {EXECUTIONS: {"part": 1, "_id": 1}, QUEUES: {"part": 1}, OVERFLOW: {"part": 1}}


def test_only_a_mongos_says_isdbgrid():
    assert is_mongos({"msg": "isdbgrid", "isWritablePrimary": True})
    assert not is_mongos({"isWritablePrimary": True, "setName": "rs0"})
    assert not is_mongos({"isWritablePrimary": True})


def test_the_partitioned_collections_are_named_as_the_store_and_transport_name_them():
    assert plan_collections(PREFIX) == {"executions": EXECUTIONS, "queues": QUEUES, "overflow": OVERFLOW}
    assert plan_collections("shop")["queues"] == "shop_hb_queues"
    assert config_filter(DB, PREFIX)["_id"] == {"$in": [f"{DB}.{EXECUTIONS}", f"{DB}.{QUEUES}", f"{DB}.{OVERFLOW}"]}


def test_live_keys_from_config_records():
    records = [
        {"_id": f"{DB}.{EXECUTIONS}", "key": {"part": 1.0, "_id": 1.0}, "unique": False},
        {"_id": f"{DB}.{QUEUES}", "key": {"part": 1}, "dropped": True},  # a server before 5.0 keeps these
        {"_id": f"other.{OVERFLOW}", "key": {"_id": "hashed"}},
        {"_id": f"{DB}.harel_counters", "key": {"_id": 1}},
    ]
    assert live_keys(records, DB, PREFIX) == {EXECUTIONS: {"part": 1.0, "_id": 1.0}, QUEUES: None, OVERFLOW: None}


def test_the_plan_s_keys_are_no_problem_even_as_doubles():
    live = {EXECUTIONS: {"part": 1.0, "_id": 1.0}, QUEUES: {"part": 1}, OVERFLOW: {"part": 1}}
    assert plan_problems(DB, PREFIX, live) == []
    assert plan_notes(DB, PREFIX, live) == []
    assert check_plan(DB, PREFIX, live) == []


def test_an_unsharded_collection_is_a_note_not_a_problem():
    live = {EXECUTIONS: {"part": 1, "_id": 1}, QUEUES: None}  # overflow: absent, also unsharded
    assert plan_problems(DB, PREFIX, live) == []
    notes = check_plan(DB, PREFIX, live)
    assert len(notes) == 2 and QUEUES in notes[0] and OVERFLOW in notes[1]
    assert "primary shard" in notes[0] and "{part: 1}" in notes[0] and "harel-beanie shard" in notes[0]


def test_executions_sharded_on_hashed_id_is_a_problem_naming_the_fix():
    problems = plan_problems(DB, PREFIX, {**PLANNED, EXECUTIONS: {"_id": "hashed"}})
    assert len(problems) == 1
    message = problems[0]
    assert f"collection {EXECUTIONS}" in message and "{_id: 'hashed'}" in message
    assert "must be sharded on {part: 1, _id: 1}" in message
    assert f"reshardCollection: '{DB}.{EXECUTIONS}', key: {{part: 1, _id: 1}}" in message
    assert "unique per shard only" not in message  # one id still has one hash


@pytest.mark.parametrize(
    "key,unique_per_shard",
    [
        ({"_id": 1, "part": 1}, False),  # the right fields in the wrong order: a problem all the same
        ({"part": "hashed"}, False),
        ({"definition_id": 1}, True),
        ({"part": 1, "status": 1}, True),
    ],
)
def test_any_other_key_is_a_problem(key, unique_per_shard):
    problems = plan_problems(DB, PREFIX, {**PLANNED, EXECUTIONS: key})
    assert len(problems) == 1 and format_key(key) in problems[0]
    assert ("unique per shard only" in problems[0]) == unique_per_shard


def test_a_claim_on_queues_sharded_elsewhere_is_explained():
    problems = plan_problems(DB, PREFIX, {**PLANNED, QUEUES: {"_id": 1}, OVERFLOW: {"g": 1}})
    assert [QUEUES in problems[0], OVERFLOW in problems[1]] == [True, True]
    assert "findAndModify" in problems[0]
    with pytest.raises(ShardPlanError) as raised:
        check_plan(DB, PREFIX, {**PLANNED, QUEUES: {"_id": 1}, OVERFLOW: {"g": 1}})
    assert raised.value.problems == problems and QUEUES in str(raised.value)


def test_keys_read_as_a_person_writes_them():
    assert format_key({"part": 1.0, "_id": 1}) == "{part: 1, _id: 1}"
    assert format_key({"_id": "hashed"}) == "{_id: 'hashed'}"


def test_the_embedded_server_is_no_mongos_and_has_no_shard_keys(client, db_name):
    from harel_beanie.store.sharding import on_mongos, read_live_keys

    assert on_mongos(client) is False
    assert read_live_keys(client, db_name, PREFIX) == {EXECUTIONS: None, QUEUES: None, OVERFLOW: None}


async def test_the_async_helpers_read_the_same(mongo_url, db_name):
    from pymongo import AsyncMongoClient

    from harel_beanie.store.sharding import on_mongos_async, read_live_keys_async

    client = AsyncMongoClient(mongo_url)
    try:
        assert await on_mongos_async(client) is False
        assert set((await read_live_keys_async(client, db_name, PREFIX)).values()) == {None}
    finally:
        await client.close()
