"""`harel-beanie shard`: refused by a server that is not a mongos (the embedded one), and,
against a recording stand-in for a mongos (no cluster runs here: SecantusDB answers "no such
command" to enableSharding and shardCollection), the exact commands it sends, that a second
run sends no shardCollection, and that it changes nothing when it refuses."""

from __future__ import annotations

from typing import Any, Iterator, Optional

import pytest
from pymongo.errors import OperationFailure

from harel_beanie.commands import cli, shard
from harel_beanie.core.documents import SCHEMA_MARKER_ID, SCHEMA_VERSION
from harel_beanie.core.errors import ConfigError, SchemaMismatch, ShardPlanError
from harel_beanie.store import connect

DB, PREFIX = "app", "harel"
EXECUTIONS, QUEUES, OVERFLOW = "harel_executions", "harel_hb_queues", "harel_hb_overflow"


class FakeMongos:
    """What `apply_plan` uses of a PyMongo client, answering as a mongos would: `hello`
    with `msg: isdbgrid`, `shardCollection` recorded into `config.collections`. Every command
    is kept in `sent` as (database, command document)."""

    def __init__(self, *, marker: Optional[dict[str, Any]], sharded: Optional[dict[str, dict]] = None) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.marker = marker
        self.config: dict[str, dict[str, Any]] = {f"{DB}.{n}": {"key": k} for n, k in (sharded or {}).items()}
        self.enabled = False
        self.hello: dict[str, Any] = {"isWritablePrimary": True, "msg": "isdbgrid"}
        self.already_enabled_code: Optional[int] = None  # a server before 6.0 refuses a second enableSharding
        self.index_conflict = False  # an index on the key exists under another name

    @property
    def admin(self) -> "_Db":
        return _Db(self, "admin")

    def __getitem__(self, name: str) -> "_Db":
        return _Db(self, name)

    def names(self) -> list[str]:
        return [next(iter(command)) for _, command in self.sent]


class _Db:
    def __init__(self, server: FakeMongos, name: str) -> None:
        self.server, self.name = server, name

    def command(self, command: Any, value: Any = 1, **kwargs: Any) -> dict[str, Any]:
        document = {command: value, **kwargs} if isinstance(command, str) else dict(command)
        self.server.sent.append((self.name, document))
        name = next(iter(document))
        if name == "hello":
            return dict(self.server.hello)
        if name == "enableSharding":
            if self.server.enabled and self.server.already_enabled_code is not None:
                raise OperationFailure("sharding already enabled", code=self.server.already_enabled_code)
            self.server.enabled = True
        elif name == "createIndexes" and self.server.index_conflict:
            raise OperationFailure("Index already exists with a different name: part_1__id_1", code=85)
        elif name == "shardCollection":
            self.server.config[document["shardCollection"]] = {"key": dict(document["key"])}
        return {"ok": 1}

    def __getitem__(self, name: str) -> "_Collection":
        return _Collection(self.server, self.name, name)


class _Collection:
    def __init__(self, server: FakeMongos, db: str, name: str) -> None:
        self.server, self.db, self.name = server, db, name

    def find(self, filter_: dict[str, Any]) -> Iterator[dict[str, Any]]:
        assert (self.db, self.name) == ("config", "collections")
        wanted = filter_["_id"]["$in"]
        return iter([{"_id": ns, **record} for ns, record in self.server.config.items() if ns in wanted])

    def find_one(self, filter_: dict[str, Any]) -> Optional[dict[str, Any]]:
        assert (self.db, self.name, filter_) == (DB, "harel_counters", {"_id": SCHEMA_MARKER_ID})
        return self.server.marker


def marker(n: int = SCHEMA_VERSION, parts: int = 16) -> dict[str, Any]:
    return {"_id": SCHEMA_MARKER_ID, "n": n, "parts": parts}


def run(server: FakeMongos) -> shard.ShardReport:
    return shard.apply_plan(server, DB, PREFIX, "mongodb://mongos", say=lambda line: None)


def test_the_first_run_enables_sharding_indexes_the_keys_and_shards_each_collection():
    server = FakeMongos(marker=marker())
    report = run(server)
    assert server.sent == [
        ("admin", {"hello": 1}),
        ("admin", {"enableSharding": DB}),
        (DB, {"createIndexes": EXECUTIONS, "indexes": [{"key": {"part": 1, "_id": 1}, "name": "hb_shard_key"}]}),
        ("admin", {"shardCollection": f"{DB}.{EXECUTIONS}", "key": {"part": 1, "_id": 1}}),
        (DB, {"createIndexes": QUEUES, "indexes": [{"key": {"part": 1}, "name": "hb_shard_key"}]}),
        ("admin", {"shardCollection": f"{DB}.{QUEUES}", "key": {"part": 1}}),
        (DB, {"createIndexes": OVERFLOW, "indexes": [{"key": {"part": 1}, "name": "hb_shard_key"}]}),
        ("admin", {"shardCollection": f"{DB}.{OVERFLOW}", "key": {"part": 1}}),
    ]
    # a shard key's field order is the key: dict equality above would not see it
    assert list(server.sent[3][1]["key"]) == ["part", "_id"]
    assert list(server.sent[2][1]["indexes"][0]["key"]) == ["part", "_id"]
    assert report.parts == 16
    assert report.steps[0] == f"database {DB}: sharding enabled"
    assert report.steps[1] == f"{EXECUTIONS}: sharded on {{part: 1, _id: 1}} (index hb_shard_key)"


@pytest.mark.parametrize("already_enabled_code", [None, 23])
def test_a_second_run_shards_nothing_again(already_enabled_code):
    server = FakeMongos(marker=marker())
    server.already_enabled_code = already_enabled_code
    run(server)
    server.sent.clear()
    report = run(server)
    assert server.names() == ["hello", "enableSharding"]
    keys = ((EXECUTIONS, "{part: 1, _id: 1}"), (QUEUES, "{part: 1}"), (OVERFLOW, "{part: 1}"))
    assert report.steps[1:] == [f"{name}: already sharded on {key}" for name, key in keys]


def test_only_the_collections_not_yet_sharded_are_sharded():
    server = FakeMongos(marker=marker(), sharded={EXECUTIONS: {"part": 1.0, "_id": 1.0}})
    run(server)
    assert [c.get("shardCollection") for _, c in server.sent if "shardCollection" in c] == [
        f"{DB}.{QUEUES}",
        f"{DB}.{OVERFLOW}",
    ]


def test_an_index_on_the_key_under_another_name_is_used_as_it_is():
    server = FakeMongos(marker=marker())
    server.index_conflict = True
    run(server)
    assert server.names().count("createIndexes") == 3 and server.names().count("shardCollection") == 3


def test_a_collection_sharded_on_another_key_stops_the_run_before_any_change():
    server = FakeMongos(marker=marker(), sharded={EXECUTIONS: {"_id": "hashed"}})
    with pytest.raises(ShardPlanError) as raised:
        run(server)
    assert f"collection {EXECUTIONS}" in str(raised.value) and "reshardCollection" in str(raised.value)
    assert server.names() == ["hello"]


@pytest.mark.parametrize("n", [SCHEMA_VERSION - 1, SCHEMA_VERSION + 1])
def test_a_database_in_another_layout_is_refused_before_any_change(n):
    server = FakeMongos(marker=marker(n))
    with pytest.raises(SchemaMismatch) as raised:
        run(server)
    assert ("harel-beanie migrate up" in str(raised.value)) == (n < SCHEMA_VERSION)
    assert server.names() == ["hello"]


def test_a_database_without_the_schema_is_refused():
    server = FakeMongos(marker=None)
    with pytest.raises(ConfigError, match="holds no harel-beanie schema"):
        run(server)
    assert server.names() == ["hello"]


@pytest.mark.parametrize("hello", [{"isWritablePrimary": True}, {"isWritablePrimary": True, "setName": "rs0"}])
def test_a_server_that_is_no_mongos_is_refused_by_the_stand_in_too(hello):
    server = FakeMongos(marker=marker())
    server.hello = hello
    with pytest.raises(ConfigError, match="is not a mongos"):
        run(server)
    assert server.names() == ["hello"]


def test_the_command_line_prints_each_step(monkeypatch, capsys):
    server = FakeMongos(marker=marker(parts=8))
    monkeypatch.setattr(connect, "wait_for_server", lambda make, url, retry: server)  # shard imports it in main
    server.close = lambda: None  # type: ignore[attr-defined]
    assert cli.main(["shard", "--url", "mongodb://mongos:27017", "--db", DB, "--prefix", PREFIX]) == 0
    out = capsys.readouterr().out
    assert f"{QUEUES}: sharded on {{part: 1}}" in out and "(8 partitions)" in out


def test_the_command_line_refuses_a_plan_conflict_in_one_line(monkeypatch, capsys):
    server = FakeMongos(marker=marker(), sharded={QUEUES: {"_id": 1}})
    monkeypatch.setattr(connect, "wait_for_server", lambda make, url, retry: server)  # shard imports it in main
    server.close = lambda: None  # type: ignore[attr-defined]
    assert cli.main(["shard", "--url", "mongodb://mongos:27017", "--db", DB]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("harel-beanie shard: collection harel_hb_queues"), err


def test_the_embedded_server_is_refused_as_no_mongos(mongo_url, db_name, monkeypatch, capsys):
    for var in ("HAREL_MONGO_DB", "HAREL_PREFIX"):
        monkeypatch.delenv(var, raising=False)
    assert cli.main(["shard", "--url", mongo_url, "--db", db_name]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "is not a mongos" in err[0] and err[0].startswith("harel-beanie shard:"), err
