"""The dashboard's actions with harel's own runners: `AsyncDurableRunner` on this package's
store, and `AsyncDistributedRunner` on this package's store and transport with an
`AsyncWorker` draining it, on the session's server. Each action is posted through the
dashboard's routes as the page posts it, and the execution is read back from the store.

The dashboard used to call `runner.send`, which `AsyncDurableRunner` does not have (it
`process`es an event at once): Send answered 500 with the runner docs/dashboard.md names.
Terminate, suspend and resume were not offered at all. What harel refuses, or would silently
not do (a stale form resuming a running execution, an event to a cancelled one, a kind no
state takes), is said on the page answering the post, below 500.
"""

from __future__ import annotations

import re
from html import unescape
from typing import Any, AsyncIterator, Optional

import httpx
import pymongo
import pytest
from fastapi import FastAPI
from harel.engine.aio.distributed import AsyncDistributedRunner
from harel.engine.aio.durable import AsyncDurableRunner

from harel_beanie import AsyncMongoStore
from harel_beanie.dashboard import DashboardActions, dashboard_router, no_auth
from harel_beanie.deploy.loader import load_models
from harel_beanie.transport import AsyncMongoTransport

TICKET = """
bind {
  work = dash_ticket_actions.work
}

event Take { who: string }
event Close {}

machine Ticket {
  context {
    fail: bool = false
  }
  initial Open

  state Open { timeout 3600 }
  state Working { on enter work }
  final Lapsed failed
  final Closed success

  from Open to Working on Take
  from Open to Lapsed on Timeout
  from Working to Closed on Close
}
"""

ACTIONS_PY = """
def work(stm, event, **kw):
    if stm.execution_ctx.get("fail"):
        raise RuntimeError("the ticket system is down")
    stm.execution_ctx["taken_by"] = event.data.get("who")
"""

EVERY = ("send", "cancel", "redrive", "terminate", "suspend", "resume")


@pytest.fixture(scope="module")
def definitions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    models = tmp_path_factory.mktemp("ticket_models")
    (models / "ticket.stm").write_text(TICKET)
    (models / "dash_ticket_actions.py").write_text(ACTIONS_PY)
    return load_models(models)


class Harness:
    """The dashboard, every action on, over one of harel's runners."""

    def __init__(self, kind: str, runner: Any, worker: Any, http: httpx.AsyncClient) -> None:
        self.kind, self.runner, self.worker, self.http = kind, runner, worker, http

    async def settle(self) -> None:
        """What the workers do with what was queued (nothing to do for the durable runner)."""
        if self.worker is not None:
            while await self.worker.step():
                pass

    async def create(self, execution_id: str, **context: Any) -> None:
        await self.runner.create("Ticket", context or None, execution_id=execution_id)
        await self.settle()

    async def page(self, execution_id: str) -> str:
        r = await self.http.get("/execution", params={"id": execution_id})
        assert r.status_code == 200, r.text
        return r.text

    async def post(self, execution_id: str, action: str, form: dict[str, str], **fields: str) -> httpx.Response:
        r = await self.http.post(
            f"/execution/{action}",
            params={"id": execution_id},
            data={"confirm": execution_id, "csrf": form[action], **fields},
        )
        await self.settle()
        return r


def forms(page: str) -> dict[str, str]:
    """The action forms the page offers: action -> its form token."""
    found = re.findall(
        r'action="[^"]*/execution/([a-z]+)\?id=[^"]*"[^>]*>\s*<input type="hidden" name="csrf" value="([0-9a-f]+)"',
        page,
    )
    return dict(found)


def message(page: str) -> Optional[str]:
    m = re.search(r'id="error">([^<]*)<', page)
    return unescape(m.group(1)) if m else None


@pytest.fixture(params=["durable", "distributed"])
async def dash(
    request: pytest.FixtureRequest, astore: AsyncMongoStore, mongo_url: str, db_name: str, definitions: Any
) -> AsyncIterator[Harness]:
    transport = worker = None
    if request.param == "durable":
        runner: Any = AsyncDurableRunner(astore, definitions)
    else:
        transport = AsyncMongoTransport(pymongo.AsyncMongoClient(mongo_url), db_name)
        runner = AsyncDistributedRunner(astore, transport, definitions)
        worker = runner.worker("dash-test", concurrency=1)
    app = FastAPI()
    actions = DashboardActions(runner, **{a: True for a in EVERY})
    app.include_router(dashboard_router(astore, auth=no_auth, actions=actions, definitions=definitions))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http:
        yield Harness(request.param, runner, worker, http)
    if transport is not None:
        await transport.close()


async def test_send_takes_the_event_with_each_runner(dash: Harness, astore: AsyncMongoStore) -> None:
    await dash.create("t-send")
    offered = forms(await dash.page("t-send"))
    r = await dash.post("t-send", "send", offered, kind="Take", data='{"who": "ana"}')
    assert r.status_code == 303 and r.headers["location"].endswith("done=send"), (r.status_code, r.text[:500])
    exe = await astore.load("t-send")
    assert exe.status.value == "RUNNING" and exe.active_path == "Working" and exe.context["taken_by"] == "ana"
    # a running execution is offered every action but resume and redrive
    assert set(offered) == {"send", "cancel", "terminate", "suspend"}


async def test_suspend_then_resume(dash: Harness, astore: AsyncMongoStore) -> None:
    await dash.create("t-pause")
    r = await dash.post("t-pause", "suspend", forms(await dash.page("t-pause")))
    assert r.status_code == 303, r.text[:500]
    assert (await astore.load("t-pause")).status.value == "SUSPENDED"
    stale = forms(await dash.page("t-pause"))
    assert "resume" in stale and "suspend" not in stale
    assert (await dash.post("t-pause", "resume", stale)).status_code == 303
    assert (await astore.load("t-pause")).status.value == "RUNNING"
    # the same form again: harel would do nothing to a RUNNING execution, and the page says so
    r = await dash.post("t-pause", "resume", stale)
    assert r.status_code == 409 and "it is RUNNING: resume applies to SUSPENDED" in (message(r.text) or "")
    assert (await astore.load("t-pause")).status.value == "RUNNING"


@pytest.mark.parametrize("action", ["cancel", "terminate"])
async def test_cancel_and_terminate_leave_no_timer_on_the_page(
    dash: Harness, astore: AsyncMongoStore, action: str
) -> None:
    """The ticket waits in Open on an hour's timer. Cancelled (the model has no cleanup, so
    harel cancels it at once) or terminated, it is finished: its page lists no timer, where it
    used to list the one harel's control plane leaves armed."""
    eid = f"t-{action}"
    await dash.create(eid)
    assert (await dash.http.get("/api/execution", params={"id": eid})).json()["timers"], "armed while open"
    offered = forms(await dash.page(eid))
    r = await dash.post(eid, action, offered)
    assert r.status_code == 303, r.text[:500]
    assert (await astore.load(eid)).status.value == "CANCELLED"
    assert (await dash.http.get("/api/execution", params={"id": eid})).json()["timers"] == []
    page = await dash.page(eid)
    assert "no timer armed" in page
    # only a Reset (harel's start-over) applies, and only where the runner processes it itself:
    # harel's workers drop every event to a cancelled execution
    assert set(forms(page)) == ({"send"} if dash.kind == "durable" else set())
    # the send form the page offered before: a cancelled execution takes no event
    r = await dash.post(eid, "send", offered, kind="Take", data='{"who": "ana"}')
    assert r.status_code == 409 and "a finished execution takes no event" in (message(r.text) or ""), r.text[:300]
    if dash.kind != "durable":
        return
    # harel's Reset starts it over, from its initial state
    r = await dash.post(eid, "send", forms(page), kind="Reset")
    assert r.status_code == 303, r.text[:500]
    exe = await astore.load(eid)
    assert exe.status.value == "RUNNING" and exe.active_path == "Open"


async def test_redrive_brings_a_failed_execution_back(dash: Harness, astore: AsyncMongoStore) -> None:
    await dash.create("t-fail", fail=True)
    await dash.post("t-fail", "send", forms(await dash.page("t-fail")), kind="Take", data='{"who": "bo"}')
    assert (await astore.load("t-fail")).status.value == "FAILED"
    offered = forms(await dash.page("t-fail"))
    assert "redrive" in offered and "suspend" not in offered
    # harel refuses a state that is not a leaf of the machine: said on the page
    r = await dash.post("t-fail", "redrive", offered, target_path="Nowhere")
    assert r.status_code == 400 and "leaf state" in (message(r.text) or ""), r.text[:300]
    assert (await astore.load("t-fail")).status.value == "FAILED"
    r = await dash.post("t-fail", "redrive", offered, target_path="Open")
    assert r.status_code == 303, r.text[:500]
    exe = await astore.load("t-fail")
    assert exe.status.value == "RUNNING" and exe.active_path == "Open"


async def test_an_event_harel_or_the_machine_refuses_is_said_on_the_page(
    dash: Harness, astore: AsyncMongoStore
) -> None:
    await dash.create("t-bad")
    offered = forms(await dash.page("t-bad"))
    cases = [
        ({"kind": "Tkae"}, 409, "no state of Ticket takes the event 'Tkae'"),  # a typo harel would drop
        ({"kind": "Take", "data": '{"who": 5}'}, 400, "doesn't fit its declaration"),  # harel's EventError
        ({"kind": "Start"}, 409, "is not sent from the dashboard"),
        ({"kind": "Cancel"}, 409, "goes through the Cancel action"),
    ]
    for fields, status, said in cases:
        r = await dash.post("t-bad", "send", offered, **fields)
        assert r.status_code == status and said in (message(r.text) or ""), (fields, r.status_code, r.text[:300])
    exe = await astore.load("t-bad")
    assert exe.status.value == "RUNNING" and exe.active_path == "Open"


class CancelOnly:
    """A runner of another make, with only `cancel`: the page says what it cannot do."""

    async def cancel(self, execution_id: str) -> None:
        raise AssertionError("not called in this test")


async def test_an_action_the_runner_lacks_is_shown_unavailable(astore: AsyncMongoStore) -> None:
    from harel.engine.execution import Execution, Status

    await astore.save(Execution(id="x-1", definition_id="Ticket", status=Status.RUNNING, active_path="Open"))
    app = FastAPI()
    key = b"k" * 32
    acts = DashboardActions(CancelOnly(), suspend=True, send=True)
    app.include_router(dashboard_router(astore, auth=no_auth, actions=acts, secret=key))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http:
        page = (await http.get("/execution", params={"id": "x-1"})).text
        assert not forms(page)
        listed = re.findall(r'<li data-action="([a-z]+)">([^<]*)</li>', page)
        assert [a for a, _ in listed] == ["send", "suspend"]
        assert "the runner (CancelOnly) has no `send` or `process`" in unescape(listed[0][1])
        from harel_beanie.dashboard.security import FormSigner

        token = FormSigner(key, "harel_dashboard").token("x-1", "suspend")
        r = await http.post("/execution/suspend", params={"id": "x-1"}, data={"confirm": "x-1", "csrf": token})
        assert r.status_code == 409 and "has no `suspend`" in (message(r.text) or "")


@pytest.mark.parametrize("kind", ["durable", "distributed"])
async def test_the_sync_runners_are_called_off_the_event_loop(
    kind: str, astore: AsyncMongoStore, mongo_url: str, db_name: str, definitions: Any
) -> None:
    """harel's sync `DurableRunner` and `DistributedRunner` refuse to run on an event loop:
    the dashboard calls them in a worker thread (on this package's sync store and transport)."""
    import asyncio

    from harel import DurableRunner
    from harel.engine.distributed import DistributedRunner

    from harel_beanie import MongoStore
    from harel_beanie.transport import MongoTransport

    store = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    transport = MongoTransport(pymongo.MongoClient(mongo_url), db_name) if kind == "distributed" else None

    def build() -> tuple[Any, Any]:
        if transport is None:
            return DurableRunner(store, definitions), None
        sync_runner = DistributedRunner(store, transport, definitions)
        return sync_runner, sync_runner.worker("dash-sync")

    runner, worker = await asyncio.to_thread(build)  # harel builds them off the loop too

    def settle() -> None:
        while worker is not None and worker.step():
            pass

    try:
        await asyncio.to_thread(runner.create, "Ticket", None, "s-1")
        await asyncio.to_thread(settle)
        app = FastAPI()
        actions = DashboardActions(runner, send=True, suspend=True)
        app.include_router(dashboard_router(astore, auth=no_auth, actions=actions))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http:
            offered = forms((await http.get("/execution", params={"id": "s-1"})).text)
            data = {"confirm": "s-1", "csrf": offered["send"], "kind": "Take", "data": '{"who": "cy"}'}
            r = await http.post("/execution/send", params={"id": "s-1"}, data=data)
            assert r.status_code == 303, r.text[:500]
            await asyncio.to_thread(settle)
            assert (await astore.load("s-1")).active_path == "Working"
            r = await http.post(
                "/execution/suspend", params={"id": "s-1"}, data={"confirm": "s-1", "csrf": offered["suspend"]}
            )
            assert r.status_code == 303 and (await astore.load("s-1")).status.value == "SUSPENDED"
    finally:
        await asyncio.to_thread(store.close)
        if transport is not None:
            await asyncio.to_thread(transport.close)
