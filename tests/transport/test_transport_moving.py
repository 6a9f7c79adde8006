"""Moving a deployment's undelivered messages between harel's Mongo transport and this
package's (`harel-beanie migrate-transport up|down`): every message arrives exactly once, in
its group's order, with its group's priority; a run cut short between its steps is finished
by running it again; a group holding messages on both sides is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pymongo
import pytest
from harel.engine.aio_transport import AsyncMongoTransport as HarelTransport
from harel.engine.schema import Names
from harel.spec.states import Event

from harel_beanie.transport import AsyncMongoTransport, moving
from harel_beanie.transport.documents import INLINE_MAX

REPO = Path(__file__).resolve().parents[2]
GROUPS = {"small": 3, "deep": INLINE_MAX + 7, "vip": 2}


async def _harel(mongo_url: str, db_name: str) -> Any:
    import motor.motor_asyncio

    return HarelTransport(motor.motor_asyncio.AsyncIOMotorClient(mongo_url), db_name)


async def _fill(t: Any) -> None:
    for group, n in GROUPS.items():
        for i in range(n):
            await t.publish(group, Event(id=f"{group}-{i}", kind="K"), priority=2 if group == "vip" else 0)


async def _drain(t: Any) -> dict[str, list[str]]:
    got: dict[str, list[str]] = {}
    vip = await t.claim("w", 30, min_priority=2)
    assert vip is not None and vip.group_id == "vip"  # the priority came along
    await t.nack(vip)
    while (lease := await t.claim("w", 30)) is not None:
        got.setdefault(lease.group_id, []).append(lease.event.id)
        await t.ack(lease)
    return got


def _cli(mongo_url: str, db_name: str, action: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harel_beanie", "migrate-transport", action, "--url", mongo_url, "--db", db_name],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )


EXPECTED = {g: [f"{g}-{i}" for i in range(n)] for g, n in GROUPS.items()}


async def test_up_then_down_moves_every_message_once_in_order(mongo_url: str, db_name: str, client: Any) -> None:
    harel = await _harel(mongo_url, db_name)
    await _fill(harel)
    done = _cli(mongo_url, db_name, "up")
    assert done.returncode == 0, done.stderr
    assert f"moved {sum(GROUPS.values())} message(s) of 3 group(s) up" in done.stdout
    assert "0 message(s) wait in harel's Mongo transport" in done.stdout
    ours = AsyncMongoTransport(pymongo.AsyncMongoClient(mongo_url), db_name)
    assert client[db_name].harel_hb_overflow.count_documents({"g": "deep"}) > 0  # the deep group spilled
    # and back down, then drained through harel's own transport
    back = _cli(mongo_url, db_name, "down")
    assert back.returncode == 0, back.stderr
    assert await _drain(harel) == EXPECTED
    assert await ours.claim("w", 30) is None
    await ours.close()
    harel._client.close()


async def test_a_run_cut_short_is_finished_by_running_it_again(
    mongo_url: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    harel = await _harel(mongo_url, db_name)
    await _fill(harel)
    db = pymongo.AsyncMongoClient(mongo_url)[db_name]
    calls = {"n": 0}
    delete_many = type(db["x"]).delete_many

    async def dies_on_the_second_group(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.name == Names("harel").messages:
            calls["n"] += 1
            if calls["n"] == 2:  # after the second group's queue is written: its step 3
                raise RuntimeError("killed")
        return await delete_many(self, *args, **kwargs)

    monkeypatch.setattr(type(db["x"]), "delete_many", dies_on_the_second_group)
    with pytest.raises(RuntimeError, match="killed"):
        await moving.up(db, "harel")
    monkeypatch.undo()
    await moving.up(db, "harel")
    ours = AsyncMongoTransport(pymongo.AsyncMongoClient(mongo_url), db_name)
    assert await _drain(ours) == EXPECTED
    assert await db[Names("harel").messages].count_documents({}) == 0
    await ours.close()
    harel._client.close()


async def test_messages_on_both_sides_are_refused(mongo_url: str, db_name: str) -> None:
    harel = await _harel(mongo_url, db_name)
    ours = AsyncMongoTransport(pymongo.AsyncMongoClient(mongo_url), db_name)
    await harel.publish("g", Event(kind="old"))
    await ours.publish("g", Event(kind="new"))
    refused = _cli(mongo_url, db_name, "up")
    assert refused.returncode == 1 and "stop the publishers" in refused.stderr, refused.stderr
    await ours.close()
    harel._client.close()
