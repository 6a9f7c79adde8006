"""Stuck means stuck, whatever happened to the timers (`harel_beanie.core.stuck`, Rules T1 and
T2): an execution RUNNING with no timer armed and nothing pending, silent for an hour, is
stuck in every view, whether or not a timer was armed and cancelled before.

The case it holds: a week-long timer armed, then cancelled as harel cancels a state's timers
when it leaves it. The cancel used to leave the timer's time as the document's bound
(`next_fire`), which kept it out of the silent ones' index, gave it no `quiet` at the fold,
and was repaired by the sweep only once due: listed by no view for about 6.9 days.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pymongo
from fastapi import FastAPI
from harel.engine.execution import Execution, Status
from harel.engine.store.base import Step, TimerOp

from harel_beanie import AsyncMongoStore, MongoStore, queries
from harel_beanie.commands import status as status_command
from harel_beanie.core.stuck import QUIET
from harel_beanie.dashboard import dashboard_router, no_auth
from harel_beanie.deploy.where import RetryPolicy, Target
from harel_beanie.telemetry.metrics import StoreMetrics, new_registry
from tests.dashboard.test_dashboard_app import client_for, sample

AFTER = 300.0
WEEK = 7 * 86_400.0


def _cancelled(store: MongoStore, eid: str, at: float, *, load: bool) -> None:
    """A RUNNING execution that arms a week-long timer in state `Wait` at `at`, then leaves
    `Wait` an hour before now (the timer cancelled, as harel cancels a state's timers when
    it leaves it): with nothing else armed and nothing pending. `load`: the cancel is
    committed over a load by the same store (its hint), else by a store that never loaded
    it (it reads the timers itself)."""
    exe = Execution(
        id=eid, definition_id="Shop", status=Status.RUNNING, active_path="Wait", created_at=at, updated_at=at
    )
    store.commit(exe, [], timers=(TimerOp("schedule", "Wait", at + WEEK),))
    stay = Step(cause="event", from_status=Status.RUNNING, to_status=Status.RUNNING)
    if load:
        loaded = store.load(eid)
        assert loaded is not None
        exe = loaded
    else:
        exe = exe.model_copy(update={"version": 1})
    exe = exe.model_copy(update={"active_path": "Idle", "updated_at": time.time() - 3600})
    store.commit(exe, [], timers=(TimerOp("cancel", "Wait"),), step=stay)


async def _views(mongo_url: str, db_name: str) -> dict[str, Any]:
    """The stuck ones every view lists, and `/metrics`' count of them, at the real clock: the
    standalone dashboard's router on a store of its own, then `status` on its own client."""
    astore = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db_name)
    await astore.init()
    app = FastAPI()
    metrics = StoreMetrics(new_registry())
    app.include_router(dashboard_router(astore, auth=no_auth, metrics=metrics, stuck_after=AFTER), prefix="/ops")
    got: dict[str, Any] = {}
    async with client_for(app) as http:
        for route in ("/ops/api/backlog", "/ops/api/failed"):
            r = await http.get(route)
            assert r.status_code == 200, r.text
            got[route] = sorted(s["id"] for s in r.json()["silent"])
        r = await http.get("/ops/failed")
        got["/ops/failed"] = sorted(eid for eid in ("hinted", "unhinted", "armed") if f">{eid}<" in r.text)
        # the backlog page shows them as its stuck tile's figure
        tile = re.search(r'stuck</div><div class="n">(\d+)</div>', (await http.get("/ops/backlog")).text)
        got["/ops/backlog stuck tile"] = tile and int(tile.group(1))
        r = await http.get("/ops/metrics")
        got["harel_executions_silent"] = sample(r.text, "harel_executions_silent")
        r = await http.get("/ops/api/execution", params={"id": "hinted"})
        got["timers on its page"] = r.json()["timers"]
    got["backlog()"] = sorted(s["id"] for s in (await queries.backlog(stuck_after=AFTER, show=20)).stuck)
    await astore.close()
    target = Target(url=mongo_url, db=db_name, prefix="harel", retry=RetryPolicy(1, 0.1, 5_000), source="--url")
    shown = await status_command.collect(target, AFTER, 20)
    got["status --json"] = sorted(s["id"] for s in shown["stuck"])
    return got


async def test_a_cancelled_week_long_timer_hides_no_silent_execution(mongo_url: str, db_name: str) -> None:
    client: Any = pymongo.MongoClient(mongo_url)
    store = MongoStore(client, db_name)
    store.init()
    at = time.time() - 7200
    _cancelled(store, "hinted", at, load=True)
    _cancelled(MongoStore(client, db_name), "unhinted", at, load=False)
    # beside them, one still waiting on its week-long timer: not stuck
    store.commit(
        Execution(id="armed", definition_id="Shop", status=Status.RUNNING, created_at=at, updated_at=at),
        [],
        timers=(TimerOp("schedule", "Wait", at + WEEK),),
    )
    want = ["hinted", "unhinted"]
    for moment in ("before a fold", "after a fold"):
        got = await _views(mongo_url, db_name)
        assert got == {
            "/ops/api/backlog": want,
            "/ops/api/failed": want,
            "/ops/backlog stuck tile": 2,
            "/ops/failed": want,
            "harel_executions_silent": 2.0,
            "timers on its page": [],
            "backlog()": want,
            "status --json": want,
        }, (moment, got)
        store.fold_counts()
    coll = client[db_name].harel_executions
    for eid in ("hinted", "unhinted"):
        doc = coll.find_one({"_id": eid}, {"timers": 1, "next_fire": 1})
        # as if the timer had never been armed (Rule T1)
        assert doc["timers"] == {} and "next_fire" not in doc, doc
    # the fold gave them `quiet` (Rule T2): read from the silent ones' index, not as written
    assert all(coll.find_one({"_id": eid}).get(QUIET) for eid in want)
    assert QUIET not in coll.find_one({"_id": "armed"})
    store.close()
