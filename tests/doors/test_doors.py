"""The doors people reach, each tried as a hostile user would: the typed queries and the
filter, the dashboard's parameters, ids and actions, and the prune archive after a kill.

Each test here is one way these doors used to give way: an operator through a filter field, a
cursor or an id; another Document class as `doc=`; `limit=True`; the listing and the backlog
after a purge; an id holding `/` (or nothing) that could not be opened; an id that ran its own
script in a confirmation handler; links that opened the wrong execution; `within=inf`; an
archive whose torn last line hid every record after it.
"""

from __future__ import annotations

import math
import re
import time
from html import unescape
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from beanie import Document
from bson import json_util
from fastapi import FastAPI
from harel.engine.execution import Execution, Status
from harel.engine.store.base import TimerOp

from harel_beanie import queries, retention
from harel_beanie.core.documents import ExecutionDocument
from harel_beanie.dashboard import DashboardActions, dashboard_router, no_auth
from harel_beanie.queries.lowest import lowest
from harel_beanie.queries.rows import ExecutionRow
from harel_beanie.queries.single import stuck_filter
from harel_beanie.queries.stuck import stuck
from tests.dashboard.test_dashboard_app import FakeRunner

OP = {"$gt": ""}


class Customer(Document):
    """A Document class of the app's own, not one of the store's."""

    name: str = ""


# --- the queries ------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["definition_id", "status", "outcome", "parent_id"])
def test_a_filter_holding_an_operator_cannot_be_built(field: str) -> None:
    """`ExecutionFilter(definition_id={"$gt": ""})` used to count every execution; now no such
    filter can exist, whichever field holds the operator."""
    with pytest.raises(TypeError, match=field):
        queries.ExecutionFilter(**{field: OP})


@pytest.mark.parametrize(
    "field,value",
    [
        ("roots_only", 1),
        ("roots_only", "true"),
        ("updated_after", math.nan),
        ("updated_before", "1"),
        ("status", "failed"),
        ("updated_after", True),
    ],
)
def test_every_filter_field_is_checked_when_built(field: str, value: Any) -> None:
    with pytest.raises((TypeError, ValueError), match=field):
        queries.ExecutionFilter(**{field: value})


CALLS: list[tuple[str, str, Callable[[], Any]]] = [
    ("execution_detail", "execution_id", lambda: queries.execution_detail(OP)),  # type: ignore[arg-type]
    ("executions_page", "after", lambda: queries.executions_page(after=OP)),  # type: ignore[arg-type]
    ("executions", "after", lambda: queries.executions(after=["x"])),  # type: ignore[arg-type]
    ("executions_page", "limit", lambda: queries.executions_page(limit=True)),
    ("executions_page", "limit", lambda: queries.executions_page(limit=0)),
    ("executions_page", "limit", lambda: queries.executions_page(limit=10**30)),
    ("executions", "doc", lambda: queries.executions(doc=Customer)),  # type: ignore[arg-type]
    ("executions_page", "doc", lambda: queries.executions_page(doc=Customer)),  # type: ignore[arg-type]
    ("status_counts", "doc", lambda: queries.status_counts(doc=Customer)),  # type: ignore[arg-type]
    ("execution_detail", "doc", lambda: queries.execution_detail("x", doc=Customer)),  # type: ignore[arg-type]
    ("status_counts", "flt", lambda: queries.status_counts({"status": OP})),  # type: ignore[arg-type]
    ("executions", "hint", lambda: queries.executions(hint="yes")),  # type: ignore[arg-type]
    ("executions_page", "hint", lambda: queries.executions_page(hint="yes")),  # type: ignore[arg-type]
    ("status_counts", "hint", lambda: queries.status_counts(hint="yes")),  # type: ignore[arg-type]
    ("lowest", "n", lambda: lowest(ExecutionDocument, {}, "updated_at", True, ExecutionRow)),
    ("stuck_filter", "older_than", lambda: stuck_filter(-1.0)),
    ("stuck", "after", lambda: stuck(after=math.nan)),
    ("stuck", "after", lambda: stuck(after="300")),  # type: ignore[arg-type]
    ("stuck", "now", lambda: stuck(now={"$gt": 0})),  # type: ignore[arg-type]
    ("stuck", "show", lambda: stuck(show=True)),
    ("stuck", "show", lambda: stuck(show=10**9)),
    ("stuck", "doc", lambda: stuck(doc=Customer)),  # type: ignore[arg-type]
    ("backlog", "timers", lambda: queries.backlog(timers=-1)),
    ("backlog", "timers", lambda: queries.backlog(timers="1")),  # type: ignore[arg-type]
    ("backlog", "oldest", lambda: queries.backlog(oldest=-1)),
    ("backlog", "oldest", lambda: queries.backlog(oldest=10**6)),
    ("backlog", "oldest", lambda: queries.backlog(oldest={"$gt": 0})),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("call", [c for _, _, c in CALLS], ids=[f"{q}-{a}" for q, a, _ in CALLS])
async def test_the_unguarded_arguments_are_refused_naming_them(astore: Any, call: Callable[[], Any]) -> None:
    """The arguments the first guards missed (the detail's id, the cursor, `doc=`, `limit`,
    the filter itself): refused with TypeError/ValueError naming the argument."""
    await astore.init()
    name = next(a for _, a, c in CALLS if c is call)
    with pytest.raises((TypeError, ValueError), match=name):
        result = call()
        if hasattr(result, "__await__"):
            await result


async def test_after_a_purge_the_listing_and_the_backlog_still_read(astore: Any) -> None:
    """A purge leaves a tombstone with no `definition_id`: the unfiltered and roots-only pages
    used to raise a ValidationError and `backlog()` a KeyError from then on."""
    await astore.save(Execution(id="keep", definition_id="Order", status=Status.RUNNING))
    await astore.save(Execution(id="gone", definition_id="Order", status=Status.DONE))
    stored = await astore.load("gone")
    assert await astore.purge("gone", stored.version)
    for flt in (queries.ExecutionFilter(), queries.ExecutionFilter(roots_only=True)):
        page = await queries.executions_page(flt)
        assert [r.id for r in page.rows] == ["keep"]
    b = await queries.backlog()
    assert b.counts == {"Order": {"RUNNING": 1}} and b.purged == 1


# --- the dashboard ------------------------------------------------------------------------------


def _app(astore: Any, **kw: Any) -> httpx.AsyncClient:
    app = FastAPI()
    app.include_router(dashboard_router(astore, auth=no_auth, **kw), prefix="/ops")
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def test_an_id_holding_a_slash_or_nothing_is_listed_and_opened(astore: Any) -> None:
    """The list page and /backlog used to answer 500 for such ids, and the execution could not
    be opened (HTML 405, JSON 404)."""
    for i in ("a/b", "", "../up"):
        await astore.save(Execution(id=i, definition_id="Order", status=Status.RUNNING))
    async with _app(astore) as http:
        for path in ("/ops/", "/ops/backlog", "/ops/api/executions"):
            assert (await http.get(path)).status_code == 200, path
        listing = (await http.get("/ops/")).text
        for i in ("a/b", "", "../up"):
            (link,) = [unescape(h) for h in re.findall(r'href="([^"]*)"', listing) if unescape(h).endswith(_q(i))]
            assert (await http.get(link)).status_code == 200, i
            r = await http.get(link.replace("/ops/execution?", "/ops/api/execution?"))
            assert r.status_code == 200 and r.json()["execution"]["id"] == i


async def test_an_id_that_shows_as_nothing_has_a_link_to_see_and_click(astore: Any) -> None:
    """The empty id (and one of only blanks) made a link with no text on the list pages: there,
    but nothing to see or click. Every page that lists executions (the list, a search, the
    failed queue, the silent list, the backlog's timers, an execution's children and parent)
    now shows a placeholder in its link, and the link still names the id exactly."""
    now = time.time()
    blank, unseen = "   ", "\t\u200b"
    await astore.commit(
        Execution(id="", definition_id="Blank", status=Status.RUNNING, updated_at=now),
        [],
        timers=(TimerOp("schedule", "Wait", now + 600),),
    )
    await astore.save(Execution(id=blank, definition_id="Blank", status=Status.FAILED, updated_at=now))
    await astore.save(Execution(id=unseen, definition_id="Blank", status=Status.RUNNING, updated_at=now - 3600))
    await astore.save(Execution(id="kid", definition_id="Blank", status=Status.RUNNING, parent_id="", updated_at=now))
    expected = {"": "(empty id)", blank: "(blank id)", unseen: "(blank id)"}
    pages = {  # page: the invisible ids it links to
        "/ops/": {"", blank, unseen},
        "/ops/?definition=Blank&status=RUNNING": {"", unseen},
        "/ops/failed": {blank, unseen},
        "/ops/backlog": {""},
        "/ops/execution?id=": {""},  # the children table's parent column
        "/ops/execution?id=kid": {""},  # its parent
    }
    async with _app(astore) as http:
        for path, ids in pages.items():
            html = (await http.get(path)).text
            shown: dict[str, set[str]] = {}
            for href, inner in re.findall(r'<a href="([^"]*/ops/execution\?id=[^"]*)"[^>]*>(.*?)</a>', html, re.S):
                text = unescape(re.sub(r"<[^>]+>", "", inner)).strip()
                shown.setdefault(unescape(href), set()).add(text)
            for i in ids:
                assert shown.get(_q(i)) == {expected[i]}, (path, i, shown)
        heading = re.search(r"<h1>(.*?)</h1>", (await http.get("/ops/execution?id=")).text, re.S)
        assert heading and "(empty id)" in heading.group(1)  # the empty id's own page names it too


def _q(execution_id: str) -> str:
    from urllib.parse import quote

    return "/ops/execution?id=" + quote(execution_id, safe="")


@pytest.mark.parametrize("execution_id", ["a?b=c", "h#x", "p%41", "100%", "sp ace", "+plus"])
async def test_links_open_exactly_the_execution_they_name(astore: Any, execution_id: str) -> None:
    """Links used to be built without URL-quoting: an id holding `?`, `#` or `%` opened another
    execution (or none). A decoy whose id is what the wrong decoding would give is stored too."""
    decoy = execution_id.split("?")[0].split("#")[0].replace("%41", "A").replace("+", " ")
    await astore.save(Execution(id=execution_id, definition_id="Order", status=Status.RUNNING))
    if decoy != execution_id:
        await astore.save(Execution(id=decoy, definition_id="Decoy", status=Status.DONE))
    async with _app(astore) as http:
        listing = (await http.get("/ops/")).text
        for href in {unescape(h) for h in re.findall(r'href="([^"]*/ops/execution\?[^"]*)"', listing)}:
            r = await http.get(href.replace("/ops/execution?", "/ops/api/execution?"))
            assert r.status_code == 200
            opened = r.json()["execution"]
            assert href == _q(opened["id"]), (href, opened["id"])
        r = await http.get("/ops/api/execution", params={"id": execution_id})
        assert r.json()["execution"]["definition_id"] == "Order"


@pytest.mark.parametrize("within", ["inf", "-inf", "1e309", "nan", "NaN", "0", "-5", "lots", "1e12"])
@pytest.mark.parametrize("path", ["/ops/", "/ops/api/executions"])
async def test_within_is_finite_and_range_checked_on_both_routes(astore: Any, path: str, within: str) -> None:
    """`?within=inf` and `1e309` used to answer 500 (an OverflowError), and `nan` reached the
    filter on the HTML route while the JSON route refused it: both refuse each now, naming
    `within` (the JSON route declares the rule in its schema, so FastAPI's own 422 answers
    there; the HTML form's text is checked by the same rule, 400)."""
    await astore.init()
    async with _app(astore) as http:
        r = await http.get(path, params={"within": within})
    assert r.status_code in (400, 422) and "within" in r.text, (within, r.status_code, r.text[:200])


async def test_a_refused_filter_value_answers_400_naming_it(astore: Any) -> None:
    await astore.init()
    async with _app(astore) as http:
        for params, name in (({"status": "FAILD"}, "status"), ({"status": "$ne"}, "status")):
            for path in ("/ops/", "/ops/api/executions"):
                r = await http.get(path, params=params)
                assert r.status_code in (400, 422) and name in r.text, (path, params)


XSS = "q');alert(1);('"


async def test_no_id_reaches_a_script_and_every_page_carries_the_policy(astore: Any) -> None:
    """With actions on, an id used to be written into an inline `onsubmit="return
    confirm('...')"` handler with HTML escaping only, which the browser decodes before it runs
    the script: `q');alert(1);('` ran its own JavaScript. Now no page holds an inline script or
    handler: the question is a `data-confirm` attribute a static script shows as text, and the
    Content-Security-Policy forbids inline scripts anyway."""
    await astore.save(Execution(id=XSS, definition_id="Order", status=Status.FAILED, active_path="A"))
    acts = DashboardActions(FakeRunner(), send=True, cancel=True, redrive=True)
    async with _app(astore, actions=acts) as http:
        pages = {p: await http.get(p) for p in ("/ops/", "/ops/failed", "/ops/backlog", _q(XSS))}
        for path, r in pages.items():
            assert r.status_code == 200, path
            html = r.text
            assert not re.search(r"\son[a-z]+\s*=", html, re.I), path  # no inline event handler
            assert not re.search(r"<script(?![^>]*\ssrc=)", html), path  # no inline script
            assert not re.search(r"<style", html), path
            csp = r.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["referrer-policy"] == "no-referrer" and r.headers["cache-control"] == "no-store"
        confirms = re.findall(r'data-confirm="([^"]*)"', pages[_q(XSS)].text)
        assert [unescape(c) for c in confirms] == [f"Send this event to {XSS}?", f"Cancel {XSS}?", f"Redrive {XSS}?"]
        for api in ("/ops/api/executions", "/ops/api/backlog", "/ops/api/failed"):
            assert (await http.get(api)).headers["cache-control"] == "no-store"
        script = await http.get("/ops/static/dashboard.js")
        assert (
            script.status_code == 200
            and "data-confirm" in script.text
            and "eval(" not in script.text
            and "innerHTML" not in script.text
        )
        assert (await http.get("/ops/static/../router.py")).status_code == 404


async def test_every_hostile_id_is_acted_on_exactly(astore: Any) -> None:
    """Each action form of an execution whose id holds anything is posted with the id typed
    as the page asks: harel's runner is called with exactly that id."""
    from harel_beanie.dashboard.links import typed_id
    from tests.support.seeds import HOSTILE_IDS

    for i in HOSTILE_IDS:
        await astore.save(Execution(id=i, definition_id="Order", status=Status.RUNNING))
    runner = FakeRunner()
    async with _app(astore, actions=DashboardActions(runner, cancel=True)) as http:
        for i in HOSTILE_IDS:
            page = (await http.get("/ops/execution", params={"id": i})).text
            form = re.search(
                r'<form method="post" action="([^"]*)"[^>]*>\s*<input type="hidden" name="csrf" '
                r'value="([0-9a-f]+)">',
                page,
            )
            assert form, i
            placeholder = unescape(re.search(r'name="confirm" placeholder="([^"]*)"', page).group(1))
            assert placeholder == typed_id(i)
            r = await http.post(unescape(form.group(1)), data={"csrf": form.group(2), "confirm": placeholder})
            assert r.status_code == 303 and "done=cancel" in r.headers["location"], (i, r.headers.get("location"))
    assert runner.calls == [("cancel", i) for i in HOSTILE_IDS]


PHISHING = "Your session expired: sign in again at https://evil.example/login"


class RefusingRunner(FakeRunner):
    async def cancel(self, execution_id: str) -> None:
        raise ValueError(f"cannot cancel {execution_id}: it is finishing")


async def test_error_shows_only_the_dashboards_own_messages(astore: Any) -> None:
    """`/execution?id=...&error=` used to put any 300 characters on the page: a crafted link
    showed staff a phishing line in the dashboard's own frame. Now `error` is a code of the
    dashboard's own messages; anything else shows nothing. A refusal by harel (its text) is
    shown on the page that answers the post, and never travels in a link."""
    await astore.save(Execution(id="x-1", definition_id="Order", status=Status.RUNNING))
    runner = RefusingRunner()
    async with _app(astore, actions=DashboardActions(runner, cancel=True)) as http:
        for text in (PHISHING, "<b>bold</b>", "confirm by typing the execution id", "stale"):
            r = await http.get("/ops/execution", params={"id": "x-1", "error": text})
            assert r.status_code == 200 and 'id="error"' not in r.text, text
            assert "evil.example" not in r.text
        r = await http.get("/ops/execution", params={"id": "x-1", "error": "confirm"})
        assert re.search(r'id="error">confirm by typing the execution id<', r.text)
        page = (await http.get(_q("x-1"))).text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)  # type: ignore[union-attr]
        r = await http.post("/ops/execution/cancel?id=x-1", data={"csrf": csrf, "confirm": "x-wrong"})
        assert r.status_code == 303 and r.headers["location"].endswith("error=confirm")
        r = await http.post("/ops/execution/cancel?id=x-1", data={"csrf": csrf, "confirm": "x-1"})
        assert r.status_code == 400 and "location" not in r.headers
        assert re.search(r'id="error">cannot cancel x-1: it is finishing<', r.text)
        assert r.headers["content-security-policy"].startswith("default-src 'none'")


async def test_forms_are_taken_by_every_app_of_one_secret_only(astore: Any) -> None:
    """The forms' key used to be drawn by each router: an app served by several processes
    refused, as stale, a form another process served. Routers given the same `secret` (the
    processes of one app) take each other's forms; another secret, or another dashboard name
    under the same secret, does not."""
    await astore.save(Execution(id="x-1", definition_id="Order", status=Status.RUNNING))
    key = b"k" * 32

    def app_of(secret: bytes, name: str = "harel_dashboard") -> httpx.AsyncClient:
        return _app(astore, actions=DashboardActions(FakeRunner(), cancel=True), secret=secret, name=name)

    async with app_of(key) as one, app_of(key) as two, app_of(b"o" * 32) as other, app_of(key, "b") as named:
        page = (await one.get(_q("x-1"))).text
        form = {"csrf": re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1), "confirm": "x-1"}  # type: ignore[union-attr]
        for stranger in (other, named):
            r = await stranger.post("/ops/execution/cancel?id=x-1", data=form)
            assert r.status_code == 403 and "stale" in r.text
        r = await two.post("/ops/execution/cancel?id=x-1", data=form)
        assert r.status_code == 303 and r.headers["location"].endswith("done=cancel")
    for bad, error in (("k" * 32, TypeError), (b"short", ValueError)):
        with pytest.raises(error, match="secret"):
            dashboard_router(astore, auth=no_auth, secret=bad)  # type: ignore[arg-type]


async def test_the_apps_own_refusals_carry_the_headers(astore: Any) -> None:
    """Inside an app's own FastAPI app, the guard's refusal and FastAPI's 422 were answered by
    the app's handlers without the dashboard's headers (a refusal page without the policy).
    They are still the app's own answers (here its login redirect, and its own answer to a
    refused request from a plain function), with the headers."""
    from fastapi import Header, HTTPException, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, RedirectResponse

    from harel_beanie.dashboard.security import CONTENT_SECURITY_POLICY

    await astore.init()

    def staff_only(x_staff: str = Header("")) -> None:
        if x_staff != "yes":
            raise HTTPException(401, "sign in")

    app = FastAPI()

    @app.exception_handler(401)
    async def to_login(request: Request, exc: Exception) -> RedirectResponse:
        return RedirectResponse("/login", status_code=303)

    def plain(request: Request, exc: Exception) -> JSONResponse:  # a plain function, run on a thread
        return JSONResponse({"refused": True}, status_code=400)

    app.add_exception_handler(RequestValidationError, plain)
    app.include_router(dashboard_router(astore, auth=staff_only), prefix="/ops")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        r = await http.get("/ops/")
        assert r.status_code == 303 and r.headers["location"] == "/login"
        assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        r = await http.get("/ops/api/execution", headers={"x-staff": "yes"})  # no id
        assert r.status_code == 400 and r.json() == {"refused": True}
        assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert r.headers["cache-control"] == "no-store" and r.headers["x-content-type-options"] == "nosniff"
        r = await http.get("/ops/api/executions", params={"limit": 0}, headers={"x-staff": "yes"})
        assert r.status_code == 400 and r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY


# --- the archive -------------------------------------------------------------------------------


def test_a_torn_tail_is_repaired_before_anything_is_appended(tmp_path: Path) -> None:
    """`prune --archive` killed in the middle of an append used to leave a torn last line that
    the next run appended after: a line that is not JSON, where `mongoimport` stops and the
    reader dropped every record after it."""
    path = tmp_path / "pruned.jsonl"
    archive = retention.JsonlArchive(path)
    archive._append([{"_id": "a", "n": 1}, {"_id": "b", "n": 2}])
    with open(path, "a") as f:
        f.write('{"_id": "c", "da')  # the kill, mid-line
    archive._append([{"_id": "c", "n": 3}, {"_id": "d", "n": 4}])  # the next run, from its journal
    lines = path.read_text().splitlines()
    assert [json_util.loads(line)["_id"] for line in lines] == ["a", "b", "c", "d"]
    assert (tmp_path / "pruned.jsonl.torn").read_text() == '{"_id": "c", "da\n'


def test_the_reader_keeps_every_good_record_and_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "hand-edited.jsonl"
    good = [json_util.dumps({"_id": i}) for i in ("a", "b", "c")]
    path.write_text("\n".join([good[0], "not json", good[1], "", "[1, 2]", good[2]]) + "\n")
    read = retention.read_jsonl(path)
    assert [r["_id"] for r in read.records] == ["a", "b", "c"]
    assert [c.number for c in read.corrupt] == [2, 5]
