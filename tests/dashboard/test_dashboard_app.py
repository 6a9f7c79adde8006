"""The dashboard router inside an app (in-process, over ASGI), its `/metrics`, the commit
instrumentation and the actions' guards."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import prometheus_client
import pytest
from fastapi import FastAPI, Header, HTTPException
from harel.engine.execution import Execution, Status
from harel.engine.store.base import StoreConflict, TimerOp
from harel.spec.states import Event
from prometheus_client import CollectorRegistry

from harel_beanie.dashboard import DashboardActions, dashboard_router, no_auth
from harel_beanie.telemetry.instrument import InstrumentedStore
from harel_beanie.telemetry.metrics import StoreMetrics


def client_for(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")


def sample(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if labels else "") + r" ([0-9.e+-]+)"
    m = re.search(pattern, text)
    assert m, (name, labels, text)
    return float(m.group(1))


async def test_metrics_endpoint_serves_the_figures(astore) -> None:
    now = time.time()
    for i in range(3):
        await astore.save(Execution(id=f"f-{i}", definition_id="Order", status=Status.FAILED, updated_at=now))
    await astore.save(Execution(id="r-1", definition_id="Payment", status=Status.RUNNING, updated_at=now - 3600))
    busy = Execution(id="busy", definition_id="Order", status=Status.RUNNING, updated_at=now)
    await astore.commit(
        busy,
        [("r-1", Event(kind="Ping"))],
        timers=(TimerOp("schedule", "Wait", now - 90),),
        spawns=(("busy:X:0", "X", {}),),
    )
    registry = CollectorRegistry()
    metrics = StoreMetrics(registry)
    # the app's own store, instrumented: its commits are timed and conflicts counted
    store = InstrumentedStore(astore, metrics=metrics)
    stale = Execution(id="r-1", definition_id="Payment", status=Status.RUNNING, version=0)
    with pytest.raises(StoreConflict):
        await store.commit(stale, [])
    exe = await store.load("f-0")
    await store.commit(exe, [])

    app = FastAPI()
    app.include_router(dashboard_router(astore, auth=no_auth, metrics=metrics), prefix="/ops")
    async with client_for(app) as http:
        r = await http.get("/ops/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert sample(text, "harel_executions", definition="Order", status="FAILED") == 3
    assert sample(text, "harel_executions", definition="Payment", status="RUNNING") == 1
    assert sample(text, "harel_pending_entries", kind="outbox") == 1
    assert sample(text, "harel_pending_entries", kind="spawn") == 1
    assert sample(text, "harel_pending_oldest_age_seconds", kind="outbox") >= 0
    assert sample(text, "harel_timers_due") == 1
    assert 85 <= sample(text, "harel_timer_lateness_seconds") < 600
    assert sample(text, "harel_executions_silent") == 1
    assert sample(text, "harel_commit_conflicts_total", definition="Payment") == 1
    assert sample(text, "harel_commit_duration_seconds_count", definition="Order") == 1
    assert sample(text, "harel_commit_duration_seconds_count", definition="Payment") == 1
    # nothing was registered globally
    assert not [n for n in prometheus_client.REGISTRY._names_to_collectors if n.startswith("harel_")]


class FakeTracer:
    def __init__(self) -> None:
        self.spans: list[tuple[str, dict[str, Any]]] = []

    def start_as_current_span(self, name: str, **kwargs: Any) -> Any:
        tracer = self

        class Span:
            def __enter__(self) -> "Span":
                self.attributes = dict(kwargs.get("attributes", {}))
                tracer.spans.append((name, self.attributes))
                return self

            def __exit__(self, *exc: Any) -> None:
                pass

            def set_attribute(self, key: str, value: Any) -> None:
                self.attributes[key] = value

            def set_status(self, status: Any) -> None:
                pass

        return Span()


async def test_spans_follow_the_database_conventions(astore, db_name) -> None:
    tracer = FakeTracer()
    store = InstrumentedStore(astore, tracer=tracer)
    await store.save(Execution(id="t-1", definition_id="Order", status=Status.RUNNING))
    assert await store.load("t-1") is not None
    with pytest.raises(StoreConflict):
        await store.commit(Execution(id="t-1", definition_id="Order", version=7), [])
    names = [n for n, _ in tracer.spans]
    assert names == ["save harel_executions", "load harel_executions", "commit harel_executions"]
    attrs = tracer.spans[-1][1]
    assert attrs["db.system.name"] == "mongodb" and attrs["db.namespace"] == db_name
    assert attrs["db.operation.name"] == "commit" and attrs["db.collection.name"] == "harel_executions"
    assert attrs["error.type"] == "StoreConflict"


class FakeRunner:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def send(self, execution_id: str, event: Event) -> None:
        self.calls.append(("send", execution_id, event.kind, event.data))

    async def cancel(self, execution_id: str) -> None:
        self.calls.append(("cancel", execution_id))

    async def redrive(self, execution_id: str, target_path: str) -> None:
        self.calls.append(("redrive", execution_id, target_path))

    async def terminate(self, execution_id: str) -> None:
        self.calls.append(("terminate", execution_id))

    async def suspend(self, execution_id: str) -> None:
        self.calls.append(("suspend", execution_id))

    async def resume(self, execution_id: str) -> None:
        self.calls.append(("resume", execution_id))


def _csrf(page: str, action: str) -> str:
    m = re.search(
        rf'action="[^"]*/{action}\?id=[^"]*"[^>]*>\s*<input type="hidden" name="csrf" value="([0-9a-f]+)"', page
    )
    assert m, page
    return m.group(1)


async def test_actions_are_off_by_default_and_each_needs_a_confirmation(astore) -> None:
    await astore.save(Execution(id="x-1", definition_id="Order", status=Status.FAILED, active_path="Paying"))
    runner = FakeRunner()
    app = FastAPI()
    app.include_router(dashboard_router(astore, auth=no_auth), prefix="/off")
    app.include_router(
        dashboard_router(astore, auth=no_auth, actions=DashboardActions(runner, cancel=True, redrive=True), name="on"),
        prefix="/on",
    )
    async with client_for(app) as http:
        page = (await http.get("/off/execution?id=x-1")).text
        assert "x-1" in page and "<form" not in page
        r = await http.post("/off/execution/cancel?id=x-1", data={"confirm": "x-1"})
        assert r.status_code == 403

        page = (await http.get("/on/execution?id=x-1")).text
        assert "/send" not in page  # not enabled
        token = _csrf(page, "cancel")
        assert (await http.post("/on/execution/send?id=x-1", data={"confirm": "x-1", "kind": "Go"})).status_code == 403
        assert (
            await http.post("/on/execution/cancel?id=x-1", data={"confirm": "x-1", "csrf": "0" * 64})
        ).status_code == 403
        r = await http.post("/on/execution/cancel?id=x-1", data={"confirm": "x-2", "csrf": token})
        assert r.status_code == 303 and "error=" in r.headers["location"] and runner.calls == []
        r = await http.post("/on/execution/cancel?id=x-1", data={"confirm": "x-1", "csrf": token})
        assert r.status_code == 303 and r.headers["location"].endswith("/on/execution?id=x-1&done=cancel")
        r = await http.post(
            "/on/execution/redrive?id=x-1",
            data={"confirm": "x-1", "csrf": _csrf(page, "redrive"), "target_path": "Paying"},
        )
        assert r.status_code == 303
    assert runner.calls == [("cancel", "x-1"), ("redrive", "x-1", "Paying")]


async def test_an_action_on_the_empty_id_is_confirmed_as_its_page_asks(astore) -> None:
    """The empty id is an id harel allows: its page offers the actions, and a confirmation
    typed as its placeholder says (`""`) runs them on it."""
    await astore.save(Execution(id="", definition_id="Order", status=Status.RUNNING, active_path="Paying"))
    runner = FakeRunner()
    app = FastAPI()
    app.include_router(dashboard_router(astore, auth=no_auth, actions=DashboardActions(runner, cancel=True)))
    async with client_for(app) as http:
        page = (await http.get("/execution?id=")).text
        assert 'placeholder="&#34;&#34;"' in page or 'placeholder="&quot;&quot;"' in page, page
        r = await http.post("/execution/cancel?id=", data={"confirm": '""', "csrf": _csrf(page, "cancel")})
        assert r.status_code == 303 and r.headers["location"].endswith("/execution?id=&done=cancel"), (
            r.status_code,
            r.text[:300],
        )
    assert runner.calls == [("cancel", "")]


async def test_the_executions_page_tells_status_and_outcome_apart(astore) -> None:
    """A declined card is an execution DONE with outcome failed: the page says what each
    word means, beside the table that shows both (the demo's report and `status` too)."""
    await astore.save(Execution(id="o-1", definition_id="Order", status=Status.DONE, outcome="failed"))
    app = FastAPI()
    app.include_router(dashboard_router(astore, auth=no_auth))
    async with client_for(app) as http:
        page = (await http.get("/")).text
    note = page[page.index('id="status-outcome"') :].split("</p>", 1)[0]
    assert "FAILED (stopped on an error, to redrive)" in note and "a declined card ends DONE, outcome failed" in note
    assert 'title="where the execution is in its life' in page


async def test_the_apps_own_guard_runs_before_every_route(astore) -> None:
    def staff_only(x_staff: str = Header("")) -> None:
        if x_staff != "yes":
            raise HTTPException(403, "staff only")

    with pytest.raises(ValueError):
        dashboard_router(astore, auth=None)  # type: ignore[arg-type]
    app = FastAPI()
    app.include_router(
        dashboard_router(astore, auth=staff_only, metrics=StoreMetrics(CollectorRegistry())), prefix="/ops"
    )
    async with client_for(app) as http:
        for path in ("/ops/", "/ops/failed", "/ops/backlog", "/ops/api/executions", "/ops/api/backlog", "/ops/metrics"):
            assert (await http.get(path)).status_code == 403, path
            assert (await http.get(path, headers={"x-staff": "yes"})).status_code == 200, path
