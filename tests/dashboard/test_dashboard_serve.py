"""The app `harel-beanie dashboard` serves (`harel_beanie.dashboard.serve.build_app`), in-process
over ASGI with its lifespan run, as the command runs it:

- every route of the built app, found in `app.routes`, answers only with the token, and every
  answer carries the security headers, the refusals and error answers (401, 403, 404, 405,
  422) included; FastAPI's default `/docs` and `/redoc` are not served;
- every view reads a database in any state (nothing in it, another prefix, indexes half made,
  another layout), says what it found and what to run, and writes nothing to a database
  that holds no store;
- the actions' forms are signed with a key derived from the token: an app of the same token
  (another process of the same command) takes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path
from typing import Any, AsyncIterator, Iterable, Optional

import httpx
import pymongo
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from harel.engine.execution import Execution, Status
from starlette.routing import Route

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.core.documents import SCHEMA_MARKER_ID, SCHEMA_VERSION
from harel_beanie.dashboard.security import CONTENT_SECURITY_POLICY
from harel_beanie.dashboard.serve import build_app
from harel_beanie.deploy.where import Target
from tests.commands.test_cli import CLI_RETRY
from tests.support.seeds import seed_harel_layout

TOKEN = "serve-token"
#: two small statecharts: the shop models the app loads by default take seconds to load
MODELS = str(Path(__file__).resolve().parents[1] / "support" / "history_models")
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def target(mongo_url: str, db: str, prefix: str = "harel") -> Target:
    return Target(mongo_url, db, prefix, CLI_RETRY, "--url")


@contextlib.asynccontextmanager
async def served(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan run (as uvicorn runs it), and a client over ASGI."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://dash") as http:
            yield http


async def first_answer(app: Any, method: str, path: str, query: str = "", headers: Iterable[tuple[str, str]] = ()):
    """The status and headers an ASGI app starts its answer with; the request is then dropped
    (so an endless answer, the live feed's, is read like any other)."""
    started: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(b"host", b"dash"), *((k.lower().encode(), v.encode()) for k, v in headers)],
        "client": ("127.0.0.1", 5000),
        "server": ("dash", 80),
    }
    body_sent = False

    async def receive() -> dict[str, Any]:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client stays until the answer has started
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and not started.done():
            started.set_result(message)

    task = asyncio.ensure_future(app(scope, receive, send))
    await asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED, timeout=30)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    assert started.done(), (method, path, "no answer started")
    message = started.result()
    return message["status"], {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}


def assert_headers(where: Any, headers: dict[str, str]) -> None:
    assert headers.get("content-security-policy") == CONTENT_SECURITY_POLICY, (where, headers)
    assert headers.get("x-content-type-options") == "nosniff", where
    assert headers.get("referrer-policy") == "no-referrer", where
    assert headers.get("x-frame-options") == "DENY", where
    assert "cache-control" in headers, where


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def built_routes(app: FastAPI) -> list[tuple[str, set[str], Any]]:
    """Every route of the app as it answers: its path, its methods and the route declared
    (`iter_route_contexts` where FastAPI keeps an included router whole, as 0.16x does;
    `app.routes` where it copies the router's routes into the app's)."""
    try:
        from fastapi.routing import iter_route_contexts  # type: ignore[attr-defined]
    except ImportError:
        return [(r.path, set(r.methods or ()), r) for r in app.routes if isinstance(r, Route)]
    return [(c.path, set(c.methods or ()), c.original_route) for c in iter_route_contexts(app.routes)]


async def test_every_route_needs_the_token_and_every_answer_carries_the_headers(mongo_url: str, db_name: str) -> None:
    """`harel-beanie dashboard` used to serve FastAPI's `/docs`, `/redoc` and `/openapi.json`
    to anyone, without the Content-Security-Policy (`/docs` runs an inline script and loads
    Swagger UI from a CDN, on the origin whose cookie carries the token and the actions), and
    its 401, 404 and 405 answers carried none of the security headers. Each route is taken
    from the built app, not from a list kept by hand: a route added later is checked too."""
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db_name)
    await store.save(Execution(id="x", definition_id="Order", status=Status.FAILED, active_path="Paying"))
    await store.close()
    app = build_app(
        target(mongo_url, db_name), token=TOKEN, allow=["cancel"], definitions_dir=MODELS, say=lambda _: None
    )
    routes = built_routes(app)
    assert all(isinstance(r, Route) for _, _, r in routes), "a route of another kind (a mount?) is not checked here"
    paths = {path for path, _, _ in routes}
    assert not paths & {"/docs", "/redoc", "/docs/oauth2-redirect"}, paths
    assert {"/", "/execution", "/live", "/metrics", "/static/{filename}", "/openapi.json"} <= paths
    async with served(app):
        checked = 0
        for declared, methods, route in routes:
            path = _concrete(declared)
            for method in sorted(methods):
                for headers in ([], [("Authorization", "Bearer wrong")], [("Cookie", "harel_dashboard_token=no")]):
                    status, got = await first_answer(app, method, path, "id=x", headers)
                    assert status == 401, (method, path, headers, status)
                    assert_headers((method, path, status), got)
                status, got = await first_answer(app, method, path, "id=x", BEARER.items())
                assert status not in (401, 500), (method, path, status)
                assert_headers((method, path, status), got)
                checked += 1
            # a method the route does not take
            status, got = await first_answer(app, "PUT", path, "id=x", BEARER.items())
            assert status == 405, (path, status)
            assert_headers(("PUT", path, status), got)
            # a required parameter left out: FastAPI's own refusal
            if isinstance(route, APIRoute) and any(p.field_info.is_required() for p in route.dependant.query_params):
                for method in methods:
                    status, got = await first_answer(app, method, path, "", BEARER.items())
                    assert status == 422, (method, path, status)
                    assert_headers((method, path, status), got)
        assert checked >= len(routes)
        for method, path, query, want in (
            ("GET", "/docs", "", 404),
            ("GET", "/redoc", "", 404),
            ("GET", "/no/such/page", "", 404),
            ("POST", "/execution/send", "id=x", 403),  # an action not turned on
            ("GET", "/live", "", 200),
        ):
            status, got = await first_answer(app, method, path, query, BEARER.items())
            assert status == want, (method, path, status)
            assert_headers((method, path, status), got)
        status, got = await first_answer(app, "GET", "/live", "", BEARER.items())
        assert got["content-type"].startswith("text/event-stream")
        # the link printed at start: the token goes into the cookie, the answer has the headers
        status, got = await first_answer(app, "GET", "/", f"token={TOKEN}")
        assert status == 303 and "harel_dashboard_token=" in got["set-cookie"]
        assert_headers("the token's redirect", got)


PAGES = (
    "/",
    "/failed",
    "/backlog",
    "/?status=FAILED",
    "/?definition=Order",
    "/?roots=true",
    "/?within=3600",
    "/?parent=p",
)
JSON = (
    "/api/executions",
    "/api/failed",
    "/api/backlog",
    "/api/charts",
    "/api/executions?status=FAILED",
    "/api/executions?definition=Order",
    "/api/executions?roots=true",
    "/api/executions?within=3600",
    "/metrics",
)


async def _seed(mongo_url: str, db: str, prefix: str = "harel") -> None:
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db, prefix=prefix)
    await store.save(Execution(id="kept-1", definition_id="Order", status=Status.FAILED, active_path="Paying"))
    await store.save(Execution(id="kept-2", definition_id="Order", status=Status.RUNNING, active_path="Paying"))
    await store.close()


@pytest.mark.parametrize("state", ["nothing", "another prefix", "indexes half made", "harel's layout", "layout 1"])
async def test_every_view_reads_a_database_in_any_state(
    mongo_url: str, db_name: str, client: pymongo.MongoClient[Any], state: str
) -> None:
    """Pointed at a database holding nothing yet (or a mistyped `--db`), the list pages and
    their JSON answered 500: the reads named indexes that did not exist (`hint 'hb_status'
    does not correspond to an existing index`), where `harel-beanie status` read the same
    database fine. Now each view answers, empty where there is nothing, and each page says
    what it found and what to run."""
    prefix, expect_rows, says, one = "harel", True, "migrate up", "kept-1"
    if state == "nothing":
        expect_rows, says = False, f"no harel-beanie schema in database {db_name!r}, prefix 'harel'"
    elif state == "another prefix":
        await _seed(mongo_url, db_name)
        prefix, expect_rows, says = "other", False, f"no harel-beanie schema in database {db_name!r}, prefix 'other'"
    elif state == "indexes half made":
        await _seed(mongo_url, db_name)
        for name in ("hb_status", "hb_definition", "hb_parent", "hb_status_updated"):
            client[db_name]["harel_executions"].drop_index(name)
        says = "lacks the indexes hb_definition, hb_status, hb_status_updated, hb_parent"
    elif state == "harel's layout":  # harel's own MongoStore wrote it: no marker, no indexes of ours
        one = next(iter(seed_harel_layout(mongo_url, db_name)))
        says = "harel's own MongoStore layout"
    else:
        await _seed(mongo_url, db_name)
        client[db_name]["harel_counters"].update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": 1}})
        says = f"is at layout 1, not this package's {SCHEMA_VERSION}: run `harel-beanie migrate up"
    app = build_app(target(mongo_url, db_name, prefix), token=TOKEN, definitions_dir=MODELS, say=lambda _: None)
    async with served(app) as http:
        for path in PAGES + JSON:
            r = await http.get(path, headers=BEARER)
            assert r.status_code == 200, (state, path, r.status_code, r.text[:300])
        listing = (await http.get("/", headers=BEARER)).text
        assert says in listing.replace("&#39;", "'").replace("&#x27;", "'"), (state, listing)
        rows = (await http.get("/api/executions", headers=BEARER)).json()["rows"]
        assert bool(rows) == expect_rows, (state, rows)
        r = await http.get("/execution", params={"id": one}, headers=BEARER)
        if state == "layout 1":  # the store itself refuses another layout: said, with the fix
            assert r.status_code == 503 and "migrate up" in r.text, r.text
        else:
            assert r.status_code == (200 if expect_rows else 404), (state, r.status_code, r.text[:300])
    if state == "nothing":  # a mistyped --db is left as it was found: not even the charts' samples
        assert db_name not in client.list_database_names() or not client[db_name].list_collection_names()


async def test_a_database_made_later_is_seen_without_a_restart(mongo_url: str, db_name: str) -> None:
    """The dashboard was started before the first worker: once the store is made, the pages
    show its executions and the notice goes (the look at the database is taken again)."""
    app = build_app(target(mongo_url, db_name), token=TOKEN, definitions_dir=MODELS, say=lambda _: None)
    async with served(app) as http:
        assert "no harel-beanie schema" in (await http.get("/", headers=BEARER)).text
        # the sync store: the async one would bind the document classes, shared in this
        # process, to its own client
        store = MongoStore(pymongo.MongoClient(mongo_url), db_name)  # makes the indexes and marker, as a worker does
        store.save(Execution(id="late", definition_id="Order", status=Status.RUNNING))
        store.close()
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            page = (await http.get("/", headers=BEARER)).text
            if "no harel-beanie schema" not in page or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.5)
        assert "no harel-beanie schema" not in page and "late" in page


def _csrf(page: str, action: str) -> Optional[str]:
    m = re.search(
        rf'action="[^"]*/{action}\?id=[^"]*"[^>]*>\s*<input type="hidden" name="csrf" value="([0-9a-f]+)"', page
    )
    return m.group(1) if m else None


async def test_the_forms_of_one_token_are_taken_by_every_process_of_it(mongo_url: str, db_name: str) -> None:
    """The forms' key used to be drawn by each process: a form one worker process served was
    refused as stale by another. Two apps built with the same token (two processes of one
    command) now take each other's forms; an app of another token does not."""
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db_name)
    await store.save(Execution(id="kept-2", definition_id="Tally", status=Status.RUNNING))
    await store.close()
    kw: dict[str, Any] = {"allow": ["cancel"], "definitions_dir": MODELS, "say": lambda _: None}
    one = build_app(target(mongo_url, db_name), token=TOKEN, **kw)
    two = build_app(target(mongo_url, db_name), token=TOKEN, **kw)
    other = build_app(target(mongo_url, db_name), token="another-token", **kw)
    async with served(one) as a, served(two) as b, served(other) as c:
        csrf = _csrf((await a.get("/execution?id=kept-2", headers=BEARER)).text, "cancel")
        assert csrf
        form = {"csrf": csrf, "confirm": "kept-2"}
        r = await c.post("/execution/cancel?id=kept-2", data=form, headers={"Authorization": "Bearer another-token"})
        assert r.status_code == 403 and "stale" in r.text
        r = await b.post("/execution/cancel?id=kept-2", data=form, headers=BEARER)
        assert r.status_code == 303 and r.headers["location"].endswith("done=cancel"), (r.status_code, r.text[:300])
