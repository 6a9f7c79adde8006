"""The dashboard's routes: HTML pages and their JSON twins, actions, static files, `/metrics`.

Why this module exists: it turns the views of `harel_beanie.dashboard.views` into an
`APIRouter` with the app's guard on every route (see the package docstring). Reading and
rendering live elsewhere; this module parses parameters, picks the rendering and runs the few
actions an app turned on, through harel's own runner API.

What it promises about what comes in (docs/SECURITY.md has the whole threat model):
- every parameter passes `harel_beanie.core.arguments` (in the queries and the filter it
  builds); a refused one is answered 400 with the message naming it, never a 500;
- an execution id travels in the query string (`/execution?id=...`), percent-encoded, never
  in the path: any id harel allows (empty, `/`, `?`, `#`, `%`, `..`, any unicode) is opened by
  exactly the link the pages build (`links.py`);
- the pages carry no inline script or event handler: behaviour is `static/dashboard.js`,
  reading `data-` attributes, under a Content-Security-Policy without 'unsafe-inline'
  (`security.py` sets it, with the other headers, on every response of this router).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Optional, Union, get_args

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response, StreamingResponse
from fastapi.templating import Jinja2Templates

from harel_beanie import queries
from harel_beanie.core.arguments import require_bool, require_int, require_seconds, require_str
from harel_beanie.core.documents import bind
from harel_beanie.core.errors import SchemaMismatch
from harel_beanie.dashboard import views
from harel_beanie.dashboard.charts import ChartsOut, Sampler, charts, samples_name, sparkline
from harel_beanie.dashboard.links import Links, id_placeholder, typed_id
from harel_beanie.dashboard.live import LiveFeed
from harel_beanie.dashboard.search import MAX_WITHIN, Search, parse_within
from harel_beanie.dashboard.security import (
    NOT_FOUND,
    REFUSED,
    DashboardRoute,
    FormSigner,
    NotFound,
    static_headers,
)
from harel_beanie.dashboard.survey import Surveyor
from harel_beanie.queries.backlog import human_duration

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"
#: the files under /static, with their media types: nothing else is served from there
STATIC_FILES = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    # Mermaid, vendored (see static/VENDORED.md): the statechart is drawn with no CDN
    "mermaid.min.js": "text/javascript",
    "mermaid.LICENSE": "text/plain",
}
MAX_PAGE = 500
#: the most a sent event's JSON data may weigh
MAX_EVENT_BYTES = 64 * 1024
ACTIONS = ("send", "cancel", "redrive")
#: what `/execution?error=` may show: the dashboard's own messages, by code
ACTION_ERRORS = {"confirm": "confirm by typing the execution id"}
#: harel's statuses as the JSON routes declare them (the HTML form also sends "" for any)
StatusName = Literal["PENDING", "RUNNING", "SUSPENDED", "CANCELLING", "DONE", "FAILED", "CANCELLED"]


@dataclass
class DashboardActions:
    """Which actions the dashboard offers; each is off unless set. `runner` is the harel
    runner the app already uses (`AsyncDurableRunner` or `AsyncDistributedRunner`): the
    dashboard only calls its `send`, `cancel` and `redrive`, so what they do and refuse is
    harel's. Each action asks for a confirmation (the execution id typed again)."""

    runner: Any = None
    send: bool = False
    cancel: bool = False
    redrive: bool = False  # harel redrives FAILED executions only; offered on those

    def enabled(self) -> list[str]:
        return [name for name in ACTIONS if getattr(self, name)]

    def __post_init__(self) -> None:
        for action in ACTIONS:  # 1 or "false" is not a switch: an action is on only when asked with True
            setattr(self, action, require_bool(action, getattr(self, action)))
        if self.enabled() and self.runner is None:
            raise ValueError("DashboardActions: an enabled action needs the harel runner to call (runner=...)")


def _when(ts: Optional[float]) -> str:
    return "" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _ago(seconds: Optional[float]) -> str:
    return "" if seconds is None else human_duration(seconds)


def _templates() -> Jinja2Templates:
    t = Jinja2Templates(directory=str(TEMPLATES))
    t.env.filters["when"] = _when
    t.env.filters["ago"] = _ago
    t.env.filters["pretty"] = lambda v: json.dumps(v, indent=2, sort_keys=True, default=str)
    t.env.filters["typed"] = typed_id
    t.env.filters["id_placeholder"] = id_placeholder
    return t


def _event_data(text: str) -> dict[str, Any]:
    """A sent event's data: a JSON object of at most `MAX_EVENT_BYTES`, with no NaN or
    infinity (harel stores strict JSON)."""

    def no_constant(name: str) -> Any:
        raise ValueError(f"data: {name} is not JSON")

    if len(text.encode("utf-8", "replace")) > MAX_EVENT_BYTES:
        raise ValueError(f"data: at most {MAX_EVENT_BYTES} bytes of JSON")
    try:
        payload = json.loads(text, parse_constant=no_constant) if text.strip() else {}
    except RecursionError:
        raise ValueError("data: nested too deeply") from None
    if not isinstance(payload, dict):
        raise ValueError("data: must be a JSON object")
    return payload


StoreArg = Union[Any, Callable[[], Any]]


def dashboard_router(
    store: StoreArg,
    *,
    auth: Callable[..., Any],
    actions: Optional[DashboardActions] = None,
    metrics: Optional[Any] = None,
    stuck_after: float = 300.0,
    page_size: int = 50,
    title: str = "harel",
    name: str = "harel_dashboard",
    definitions: Optional[Mapping[str, Any]] = None,
    secret: Optional[bytes] = None,
) -> APIRouter:
    """The dashboard as a router (see the package docstring). `metrics`: a
    `harel_beanie.telemetry.metrics.StoreMetrics` to serve at `/metrics`, refreshed on each scrape.
    `name` prefixes the route names; give each a different one to mount two dashboards (two
    databases, say) in one app. `definitions` (harel `Definition`s by id, as
    `harel_beanie.deploy.load_models` returns them) lets the execution page draw each execution
    on its statechart; an execution of a definition not among them shows its states as text.
    `secret` (at least 16 bytes) signs the actions' forms: give every process serving the app
    the same one, or a form one process served is refused by the others (stale); without it,
    each router draws its own, which serves an app of one process."""
    if auth is None:
        raise ValueError("dashboard_router needs auth=: your FastAPI dependency, or no_auth to leave it open")
    stuck_after = require_seconds("stuck_after", stuck_after)
    page_size = require_int("page_size", page_size, low=1, high=MAX_PAGE)
    title, name = require_str("title", title), require_str("name", name)
    acts = actions or DashboardActions()
    templates = _templates()
    forms = FormSigner(secret, name)  # a cross-site form cannot know its key
    assert get_args(StatusName) == queries.STATUSES  # one list of harel's statuses
    router = APIRouter(dependencies=[Depends(auth)], route_class=DashboardRoute)
    errors: dict[int | str, dict[str, Any]] = {400: REFUSED, 404: NOT_FOUND}

    sampler = Sampler()
    surveyor = Surveyor()

    async def ready() -> Any:
        s = store() if callable(store) and not hasattr(store, "read_trace") else store
        try:
            await s.init()  # idempotent: Beanie classes bound, layout checked
        except SchemaMismatch:
            pass  # Beanie is bound before the check: the lists still read, and the survey says why not all
        found = await surveyor(s.settings.prefix)
        if found.holds_store:  # a database without the store's data is left as it was found
            sampler.start(doc_of(s), samples_of(s))  # once: a sample a minute for the charts
        return s

    def samples_of(s: Any) -> Any:
        executions = doc_of(s).get_pymongo_collection()
        return executions.database[samples_name(s.settings.prefix)]

    def doc_of(s: Any) -> Any:
        return bind(s.settings.prefix)[0]

    def hint(s: Any) -> bool:
        # name the index to the server only where every index the reads name exists (the
        # survey `ready` took): a hint naming a missing index is an error, not a slower read
        return surveyor.latest is not None and surveyor.latest.hint

    def page(request: Request, template: str, **context: Any) -> HTMLResponse:
        links = Links(request, name)
        notice = surveyor.latest.notice() if surveyor.latest is not None else None
        return templates.TemplateResponse(request, template, {"title": title, "u": links.route, "link": links.to,
                                                              "read_at": time.time(), "notice": notice,
                                                              **context})  # fmt: skip

    # --- the executions list ------------------------------------------------------------------

    async def list_data(search: Search, after: Optional[str], limit: int) -> views.ExecutionsView:
        flt = search.to_filter()
        s = await ready()
        return await views.executions_view(flt, after=after or None, limit=limit, doc=doc_of(s), hint=hint(s))

    @router.get("/api/executions", response_model=views.ExecutionsView, name=f"{name}.api_executions", responses=errors)
    async def api_executions(
        definition: Optional[str] = None, status: Optional[StatusName] = None, outcome: Optional[str] = None,
        parent: Optional[str] = None, roots: bool = False,
        prefix: Optional[str] = Query(None, description="ids starting with this, literally"),
        # declared as the rule has it, so the schema says what is refused (the search applies it)
        within: Optional[float] = Query(None, gt=0, le=MAX_WITHIN, allow_inf_nan=False,
                                        description="updated within this many seconds"),
        updated_after: Optional[float] = Query(None, allow_inf_nan=False, description="epoch seconds, inclusive"),
        updated_before: Optional[float] = Query(None, allow_inf_nan=False, description="epoch seconds, exclusive"),
        after: Optional[str] = Query(None, description="the next_after of the previous page"),
        limit: int = Query(page_size, ge=1, le=MAX_PAGE),
    ) -> views.ExecutionsView:  # fmt: skip
        text = lambda v: "" if v is None else repr(v)  # noqa: E731
        search = Search(prefix or "", definition or "", status or "", outcome or "", parent or "", roots,
                        text(within), text(updated_after), text(updated_before))  # fmt: skip
        return await list_data(search, after, limit)

    @router.get("/", response_class=HTMLResponse, name=f"{name}.executions", include_in_schema=False)
    async def executions_page(
        request: Request, definition: str = "", status: str = "", outcome: str = "", parent: str = "",
        roots: bool = False, within: str = "", prefix: str = "", since: str = Query("", alias="from"),
        until: str = Query("", alias="to"), after: Optional[str] = None,
        limit: int = Query(page_size, ge=1, le=MAX_PAGE),
    ) -> HTMLResponse:  # fmt: skip
        search = Search(prefix, definition, status, outcome, parent, roots, within, since, until)
        data = await list_data(search, after, limit)
        s = await ready()
        drawn = await charts(samples_of(s), hint=hint(s))
        params = search.params(limit=limit if limit != page_size else None)
        return page(request, "executions.html", view=data, params=params, statuses=queries.STATUSES,
                    within=parse_within(within), search=search, charts=drawn, spark=sparkline)  # fmt: skip

    @router.get("/api/charts", response_model=ChartsOut, name=f"{name}.api_charts", responses=errors)
    async def api_charts() -> ChartsOut:
        s = await ready()
        return await charts(samples_of(s), hint=hint(s))

    # --- one execution ------------------------------------------------------------------------

    async def detail_data(execution_id: str) -> views.ExecutionView:
        s = await ready()
        v = await views.execution_view(s, execution_id, doc=doc_of(s), actions=acts.enabled(),
                                       definitions=definitions or {})  # fmt: skip
        if v is None:
            tomb = await queries.purged(execution_id, doc=doc_of(s))
            gone = f" (purged at {_when(tomb.at)})" if tomb is not None else ""
            raise NotFound(f"no execution {execution_id!r}{gone}")
        return v

    @router.get("/api/execution", response_model=views.ExecutionView, name=f"{name}.api_execution", responses=errors)
    async def api_execution(execution_id: str = Query(..., alias="id", description="the execution's id")) -> Any:
        return await detail_data(execution_id)

    @router.get(
        "/api/executions/{execution_id:path}",
        response_model=views.ExecutionView,
        name=f"{name}.api_execution_by_path",
        responses=errors,
        deprecated=True,
        description="The same as /api/execution?id=...; an id holding `/`, `..` or nothing cannot travel in a path.",
    )
    async def api_execution_by_path(execution_id: str) -> Any:
        return await detail_data(execution_id)

    @router.get("/execution", response_class=HTMLResponse, name=f"{name}.execution", include_in_schema=False)
    async def execution_page(
        request: Request, execution_id: str = Query(..., alias="id"), done: Optional[str] = None,
        error: Optional[str] = None,
    ) -> HTMLResponse:  # fmt: skip
        v = await detail_data(execution_id)
        tokens = {a: forms.token(execution_id, a) for a in acts.enabled()}
        done = done if done in ACTIONS else None  # only ever one of the action names
        # only ever one of the dashboard's own messages: a link cannot put words on this page
        shown = ACTION_ERRORS.get(error) if error is not None else None
        return page(request, "execution.html", view=v, e=v.execution, done=done, error=shown, tokens=tokens)

    @router.get("/executions/{execution_id:path}", name=f"{name}.execution_by_path", include_in_schema=False)
    async def execution_by_path(request: Request, execution_id: str) -> Response:
        # the address older pages linked to: the same page, at its address by query
        return RedirectResponse(Links(request, name).to("execution", id=execution_id), status_code=307)

    # --- the failed queue, the silent ones, the backlog ----------------------------------------

    async def failed_data(after: Optional[str], limit: int) -> views.FailedView:
        s = await ready()
        return await views.failed_view(
            after=after or None, limit=limit, stuck_after=stuck_after, doc=doc_of(s), hint=hint(s)
        )

    @router.get("/api/failed", response_model=views.FailedView, name=f"{name}.api_failed", responses=errors)
    async def api_failed(
        after: Optional[str] = None, limit: int = Query(page_size, ge=1, le=MAX_PAGE)
    ) -> views.FailedView:
        return await failed_data(after, limit)

    @router.get("/failed", response_class=HTMLResponse, name=f"{name}.failed", include_in_schema=False)
    async def failed_page(
        request: Request, after: Optional[str] = None, limit: int = Query(page_size, ge=1, le=MAX_PAGE)
    ) -> HTMLResponse:
        return page(request, "failed.html", view=await failed_data(after, limit))

    async def backlog_data() -> views.BacklogView:
        s = await ready()
        return await views.backlog_view(stuck_after=stuck_after, show=20, doc=doc_of(s))

    @router.get("/api/backlog", response_model=views.BacklogView, name=f"{name}.api_backlog", responses=errors)
    async def api_backlog() -> views.BacklogView:
        return await backlog_data()

    @router.get("/backlog", response_class=HTMLResponse, name=f"{name}.backlog", include_in_schema=False)
    async def backlog_page(request: Request) -> HTMLResponse:
        return page(request, "backlog.html", view=await backlog_data(), statuses=queries.STATUSES)

    # --- live pages: one change feed, pushed to each open page (see live.py) --------------

    feed = LiveFeed()

    @router.get("/live", name=f"{name}.live", include_in_schema=False)
    async def live_events(request: Request) -> Response:
        s = await ready()
        executions = doc_of(s).get_pymongo_collection()
        wakeups = feed.start(executions.database, executions.name)
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(feed.events(wakeups, request.is_disconnected), media_type="text/event-stream",
                                 headers=headers)  # fmt: skip

    # --- the script and the styles (files of the package: the CSP allows nothing inline) ----

    @router.get("/static/{filename}", name=f"{name}.static", include_in_schema=False)
    async def static(filename: str) -> Response:
        media = STATIC_FILES.get(filename)
        if media is None:
            raise NotFound(f"no static file {filename!r}")
        return FileResponse(STATIC / filename, media_type=media, headers=static_headers())

    # --- actions (off unless the app turned them on) -------------------------------------------

    @router.post("/execution/{action}", name=f"{name}.action", include_in_schema=False)
    async def act(
        request: Request, action: str, execution_id: str = Query(..., alias="id"), confirm: str = Form(""),
        csrf: str = Form(""), kind: str = Form(""), data: str = Form(""), target_path: str = Form(""),
    ) -> Response:  # fmt: skip
        links = Links(request, name)
        if action not in acts.enabled():
            return Response(f"the {action[:40]!r} action is not enabled on this dashboard", status_code=403)
        if not forms.valid(csrf, execution_id, action):
            return Response("the form is stale or was not served by this dashboard: reload the page", status_code=403)
        if confirm.strip() not in (execution_id.strip(), typed_id(execution_id).strip()):
            return RedirectResponse(links.to("execution", id=execution_id, error="confirm"), status_code=303)
        await ready()
        from harel.spec.states import Event

        try:
            if action == "send":
                payload = _event_data(data)
                if not kind.strip():
                    raise ValueError("an event needs a kind")
                await acts.runner.send(execution_id, Event(kind=kind.strip(), data=payload))
            elif action == "cancel":
                await acts.runner.cancel(execution_id)
            else:
                if not target_path.strip():
                    raise ValueError("redrive needs the leaf state to resume in")
                await acts.runner.redrive(execution_id, target_path.strip())
        except (ValueError, KeyError, TypeError) as exc:
            # harel's refusals (and bad input): the page, answering this post, says why; the
            # text never travels in a link (?error= takes only the codes of ACTION_ERRORS)
            v = await detail_data(execution_id)
            tokens = {a: forms.token(execution_id, a) for a in acts.enabled()}
            answer = page(request, "execution.html", view=v, e=v.execution, done=None, error=str(exc)[:300],
                          tokens=tokens)  # fmt: skip
            answer.status_code = 400
            return answer
        return RedirectResponse(links.to("execution", id=execution_id, done=action), status_code=303)

    # --- Prometheus --------------------------------------------------------------------------

    if metrics is not None:

        @router.get("/metrics", name=f"{name}.metrics", include_in_schema=False)
        async def metrics_endpoint() -> Response:
            from prometheus_client import CONTENT_TYPE_LATEST

            s = await ready()
            await metrics.refresh(doc=doc_of(s), stuck_after=stuck_after)
            return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return router
