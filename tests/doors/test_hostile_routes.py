"""Hostile values at every route of the dashboard, found by enumeration: the built app's routes
(`app.routes`), each query parameter, path parameter and form field a route reads, the HTML
pages (their `from`, `to`, `after`, `prefix`, `error`, ...) as well as the JSON routes, and
the action forms posted with a valid form token and confirmation so that their fields (`kind`,
`data`, `target_path`) reach the action itself. The app runs in process behind its token.

The oracle: never a 500 (nor an exception out of the app), and no value reflected into an
HTML page as markup: every value carries a marker element, which a page may show only escaped.
A route added later is fuzzed without anyone listing it; `test_every_route_is_fuzzed` fails
for a route neither fuzzed nor named in `NOT_FUZZED` with its reason.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from dataclasses import dataclass
from html import unescape
from typing import Any, Iterator
from urllib.parse import quote

import httpx
import pymongo
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harel_beanie import AsyncMongoStore
from harel_beanie.dashboard import DashboardActions, dashboard_router, token_auth
from harel_beanie.telemetry import StoreMetrics, new_registry
from tests.dashboard.test_dashboard_app import FakeRunner
from tests.support.fuzz_strategies import SPECIAL, clean_text
from tests.support.seeds import HOSTILE_IDS, seed_everything

TOKEN = "t0ken-" + uuid.uuid4().hex
PREFIX = "/ops"
#: an element no page writes: seen raw in a page, a value was reflected as markup
MARK = '<hb-mark x="1">'
#: routes not fuzzed, with the reason
NOT_FUZZED = {f"{PREFIX}/live": "a server-sent event stream that never ends: it reads no parameter"}
ACTIONS = ("send", "cancel", "redrive", "terminate", "suspend", "resume")

numbers_as_text = st.sampled_from(["nan", "NaN", "inf", "-inf", "1e309", "-1", "0", "1e308", "2.5", "true", ""])
seeded_ids = st.sampled_from(["order-1", "failed-1", "purged-1", *HOSTILE_IDS[:20]])
hostile_text = st.one_of(
    clean_text,
    numbers_as_text,
    seeded_ids,
    st.lists(st.sampled_from(SPECIAL), min_size=1, max_size=6).map("".join),
    st.sampled_from(["$gt", '{"$gt": ""}', "[]", "{}", "2024-13-45T99:99", "@nan", "../../etc/passwd", "%00"]),
).map(lambda s: s + MARK)
maybe_text = st.one_of(st.none(), hostile_text, numbers_as_text, seeded_ids)


class App:
    """The dashboard on a seeded database, with every action on, behind a token, driven on a
    loop of its own (hypothesis drives plain functions)."""

    def __init__(self, url: str, db_name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.runner = FakeRunner()
        self.store = self.loop.run_until_complete(self._seed(url, db_name))
        app = FastAPI()
        acts = DashboardActions(self.runner, **{a: True for a in ACTIONS})
        router = dashboard_router(
            self.store, auth=token_auth(TOKEN), actions=acts, metrics=StoreMetrics(new_registry())
        )
        app.include_router(router, prefix=PREFIX)
        self.app = app
        transport = httpx.ASGITransport(app=app)  # an exception out of the app is raised here
        self.http = httpx.AsyncClient(
            transport=transport, base_url="http://t", headers={"Authorization": f"Bearer {TOKEN}"}
        )

    @staticmethod
    async def _seed(url: str, db_name: str) -> AsyncMongoStore:
        store = AsyncMongoStore(pymongo.AsyncMongoClient(url), db_name)
        await seed_everything(store, url, db_name, largest=False)
        return store

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return self.loop.run_until_complete(self.http.request(method, path, **kw))

    def close(self) -> None:
        self.loop.run_until_complete(self.http.aclose())
        self.loop.run_until_complete(self.store.close())
        self.loop.close()


@pytest.fixture(scope="module")
def dash(mongo_url: str) -> Iterator[App]:
    db_name = f"hbt_routes_{uuid.uuid4().hex[:10]}"
    a = App(mongo_url, db_name)
    yield a
    a.close()
    pymongo.MongoClient(mongo_url).drop_database(db_name)


@dataclass(frozen=True)
class Route:
    """A route as the app serves it: its full path (with the prefix it was included at)."""

    path: str
    methods: frozenset[str]
    route: APIRoute


def all_routes(app: FastAPI) -> list[Route]:
    """Every API route of the app, through the routers it includes (at any depth)."""

    def walk(found: list[Any], prefix: str) -> Iterator[Route]:
        for r in found:
            if isinstance(r, APIRoute):
                yield Route(prefix + r.path, frozenset(r.methods), r)
            elif hasattr(r, "original_router"):  # a router included in the app, at its prefix
                yield from walk(r.original_router.routes, prefix + r.include_context.prefix)

    return list(walk(app.routes, ""))


def routes(app: FastAPI) -> list[Route]:
    return [r for r in all_routes(app) if r.path not in NOT_FUZZED]


def inputs(route: Route) -> tuple[list[str], list[str], list[str]]:
    """The names a route reads from the query string, the path and the form, as sent."""
    d = route.route.dependant
    return ([p.alias for p in d.query_params], [p.alias for p in d.path_params], [p.alias for p in d.body_params])


def _check(r: httpx.Response, what: str) -> None:
    assert r.status_code < 500, f"{what}: {r.status_code} {r.text[:300]}"
    if r.headers.get("content-type", "").startswith("text/html"):
        assert MARK not in r.text, f"{what}: a value was written into the page as markup"


def _path(route: Route, values: dict[str, str]) -> str:
    path = route.path
    for name, value in values.items():
        path = re.sub(r"\{" + name + r"(:[a-z]+)?\}", quote(value, safe=""), path)
    return path


def _send(dash: App, route: Route, query: dict[str, Any], path: dict[str, str], form: dict[str, Any]) -> None:
    method = sorted(route.methods)[0]
    params = {k: v for k, v in query.items() if v is not None}
    data = {k: v for k, v in form.items() if v is not None} if method == "POST" else None
    url = _path(route, path)
    r = dash.request(method, url, params=params, data=data)
    _check(r, f"{method} {url} {params} {data}")
    if r.status_code in (303, 307):  # the page it sends the browser to, with what it carries
        _check(dash.request("GET", r.headers["location"]), f"after {method} {url}: {r.headers['location']}")


def fuzz_route(dash: App, route: Route, examples: Any) -> None:
    query, path, form = inputs(route)

    @examples
    @given(
        q=st.fixed_dictionaries({}, optional={n: maybe_text for n in query}),
        p=st.fixed_dictionaries({n: hostile_text for n in path}),
        f=st.fixed_dictionaries({}, optional={n: maybe_text for n in form}),
    )
    def one(q: dict[str, Any], p: dict[str, str], f: dict[str, Any]) -> None:
        if "action" in p:  # half the time an action the router offers, so its form is read
            p = {**p, "action": ACTIONS[len(p["action"]) % len(ACTIONS)]} if len(p["action"]) % 2 else p
        _send(dash, route, q, p, f)

    one()


def fuzz_actions(dash: App, examples: Any) -> None:
    """The action forms as a browser posts them: the form token and the confirmation the
    execution's page serves, and hostile values in the fields the action reads."""

    @examples
    @given(
        execution_id=seeded_ids,
        action=st.sampled_from(ACTIONS),
        kind=maybe_text,
        data=st.one_of(
            maybe_text, st.sampled_from(['{"a": NaN}', '{"a": 1}', "[1]", "[" * 5000, '{"<x>": "' + MARK + '"}'])
        ),
        target_path=maybe_text,
    )
    def one(execution_id: str, action: str, kind: Any, data: Any, target_path: Any) -> None:
        page = dash.request("GET", f"{PREFIX}/execution", params={"id": execution_id})
        _check(page, f"the page of {execution_id!r}")
        if page.status_code != 200:
            return  # purged: no form
        m = re.search(
            rf'action="([^"]*/{action}\?id=[^"]*)"[^>]*>\s*<input type="hidden" name="csrf" '
            rf'value="([0-9a-f]+)"',
            page.text,
        )
        confirm = re.search(r'name="confirm" placeholder="([^"]*)"', page.text)
        if m is None:
            return  # not offered for this execution (redrive: FAILED ones only)
        assert confirm, f"no confirmation on the page of {execution_id!r}"
        form = {
            "csrf": m.group(2),
            "confirm": unescape(confirm.group(1)),
            "kind": kind,
            "data": data,
            "target_path": target_path,
        }
        r = dash.request("POST", unescape(m.group(1)), data={k: v for k, v in form.items() if v is not None})
        _check(r, f"POST {action} on {execution_id!r} with {form}")
        # done: back to the page; refused by harel or by the form's own checks: the page again,
        # answering 400 with the refusal on it (never in a link)
        assert r.status_code in (303, 400), (r.status_code, r.text[:200])
        if r.status_code == 303:
            _check(dash.request("GET", r.headers["location"]), f"after {action}: {r.headers['location']}")

    one()


FAST = settings(max_examples=8, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
SOAK = settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def test_every_route_is_fuzzed(dash: App) -> None:
    """Every route of the built app is fuzzed below or named in NOT_FUZZED, and each route
    that reads a value is seen to read one (so a parameter renamed is not fuzzed by a stale name)."""
    paths = {r.path for r in all_routes(dash.app)}
    assert set(NOT_FUZZED) <= paths
    read = {r.path: inputs(r) for r in routes(dash.app)}
    assert read[f"{PREFIX}/"][0] and {"from", "to", "after", "prefix"} <= set(read[f"{PREFIX}/"][0])
    assert "error" in read[f"{PREFIX}/execution"][0]
    assert {"kind", "data", "target_path", "confirm", "csrf"} <= set(read[f"{PREFIX}/execution/{{action}}"][2])


def _ids(app_routes: list[Route]) -> list[str]:
    return [f"{sorted(r.methods)[0]} {r.path}" for r in app_routes]


def _route_names() -> list[str]:
    # the routes as built (the same app the fixture builds), for stable test ids
    app = FastAPI()
    acts = DashboardActions(FakeRunner(), **{a: True for a in ACTIONS})
    app.include_router(
        dashboard_router(object(), auth=token_auth(TOKEN), actions=acts, metrics=StoreMetrics(new_registry())),
        prefix=PREFIX,
    )
    return _ids(routes(app))


ROUTES = _route_names()


@pytest.mark.parametrize("route_id", ROUTES)
def test_every_route_answers_hostile_values_without_a_500_or_markup(dash: App, route_id: str) -> None:
    (route,) = [r for r in routes(dash.app) if _ids([r])[0] == route_id]
    fuzz_route(dash, route, FAST)


def test_the_action_forms_take_hostile_fields_without_a_500_or_markup(dash: App) -> None:
    fuzz_actions(dash, FAST)
    assert dash.runner.calls  # the forms reached the runner: their fields were read


@pytest.mark.soak
def test_every_route_at_length(dash: App) -> None:
    for route in routes(dash.app):
        fuzz_route(dash, route, SOAK)
    fuzz_actions(dash, SOAK)
