"""The dashboard's routes: HTML pages and their JSON twins, actions, and `/metrics`.

Why this module exists: it turns the views of `harel_beanie.dashboard.views` into an
`APIRouter` with the app's guard on every route (see the package docstring). Reading and
rendering live elsewhere; this module parses query parameters, picks the rendering and runs
the few actions an app turned on, through harel's own runner API.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

from fastapi import APIRouter, Depends, Form, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from harel_beanie import queries
from harel_beanie.core.documents import bind
from harel_beanie.dashboard import views
from harel_beanie.ops.status import human_duration

TEMPLATES = Path(__file__).parent / "templates"
MAX_PAGE = 500


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
        return [name for name in ("send", "cancel", "redrive") if getattr(self, name)]

    def __post_init__(self) -> None:
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
    return t


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
) -> APIRouter:
    """The dashboard as a router (see the package docstring). `metrics`: a
    `harel_beanie.telemetry.metrics.StoreMetrics` to serve at `/metrics`, refreshed on each scrape.
    `name` prefixes the route names; give each a different one to mount two dashboards (two
    databases, say) in one app."""
    if auth is None:
        raise ValueError("dashboard_router needs auth=: your FastAPI dependency, or no_auth to leave it open")
    acts = actions or DashboardActions()
    templates = _templates()
    secret = secrets.token_bytes(32)  # signs the actions' forms (a cross-site form cannot know it)
    router = APIRouter(dependencies=[Depends(auth)])

    async def ready() -> Any:
        s = store() if callable(store) and not hasattr(store, "read_trace") else store
        await s.init()  # idempotent: Beanie classes bound, layout checked
        return s

    def doc_of(s: Any) -> Any:
        return bind(s.settings.prefix)[0]

    def hint(s: Any) -> bool:
        # name the index to the server, unless the database is still in harel's layout (no
        # indexes yet: the store runs in compatibility mode until `migrate up`)
        state = getattr(s, "_state", None)
        return bool(state is not None and state.ready and not state.compat)

    def form_token(execution_id: str, action: str) -> str:
        return hmac.new(secret, f"{execution_id}\0{action}".encode(), hashlib.sha256).hexdigest()

    def page(request: Request, template: str, **context: Any) -> HTMLResponse:
        def u(route: str, **params: Any) -> Any:  # this dashboard's own routes, wherever it is mounted
            return request.url_for(f"{name}.{route}", **params)

        return templates.TemplateResponse(request, template, {"title": title, "u": u, **context})

    def parse_filter(definition: Optional[str], status: Optional[str], outcome: Optional[str], parent: Optional[str],
                     roots: bool, within: Optional[float]) -> queries.ExecutionFilter:  # fmt: skip
        if status and status not in queries.STATUSES:
            raise HTTPException(422, f"unknown status {status!r}; one of {', '.join(queries.STATUSES)}")
        return queries.ExecutionFilter(
            definition_id=definition or None, status=status or None, outcome=outcome or None, parent_id=parent or None,
            roots_only=roots, updated_after=(time.time() - within) if within else None,
        )  # fmt: skip

    # --- the executions list ------------------------------------------------------------------

    async def list_data(definition: Optional[str], status: Optional[str], outcome: Optional[str], parent: Optional[str],
                        roots: bool, within: Optional[float], after: Optional[str], limit: int) -> views.ExecutionsView:  # fmt: skip
        s = await ready()
        flt = parse_filter(definition, status, outcome, parent, roots, within)
        return await views.executions_view(
            flt, after=after or None, limit=min(limit, MAX_PAGE), doc=doc_of(s), hint=hint(s)
        )

    @router.get("/api/executions", response_model=views.ExecutionsView, name=f"{name}.api_executions")
    async def api_executions(
        definition: Optional[str] = None, status: Optional[str] = None, outcome: Optional[str] = None,
        parent: Optional[str] = None, roots: bool = False,
        within: Optional[float] = Query(None, gt=0, description="updated within this many seconds"),
        after: Optional[str] = Query(None, description="the next_after of the previous page"),
        limit: int = Query(page_size, ge=1, le=MAX_PAGE),
    ) -> views.ExecutionsView:  # fmt: skip
        return await list_data(definition, status, outcome, parent, roots, within, after, limit)

    @router.get("/", response_class=HTMLResponse, name=f"{name}.executions", include_in_schema=False)
    async def executions_page(
        request: Request, definition: Optional[str] = None, status: Optional[str] = None, outcome: Optional[str] = None,
        parent: Optional[str] = None, roots: bool = False, within: Optional[str] = None,
        after: Optional[str] = None, limit: int = Query(page_size, ge=1, le=MAX_PAGE),
    ) -> HTMLResponse:  # fmt: skip
        # a form's empty choice arrives as "": it means no bound, not a bad number
        try:
            seconds = float(within) if within else None
        except ValueError:
            raise HTTPException(422, f"within: expected seconds, got {within!r}") from None
        if seconds is not None and seconds <= 0:
            seconds = None
        data = await list_data(definition, status, outcome, parent, roots, seconds, after, limit)
        params = {k: v for k, v in {"definition": definition, "status": status, "outcome": outcome, "parent": parent,
                                     "roots": "true" if roots else None, "within": seconds,
                                     "limit": limit if limit != page_size else None}.items() if v}  # fmt: skip
        return page(request, "executions.html", view=data, params=params, statuses=queries.STATUSES, within=seconds)

    # --- one execution ------------------------------------------------------------------------

    async def detail_data(execution_id: str) -> views.ExecutionView:
        s = await ready()
        v = await views.execution_view(s, execution_id, doc=doc_of(s), actions=acts.enabled())
        if v is None:
            raise HTTPException(404, f"no execution {execution_id!r}")
        return v

    @router.get("/api/executions/{execution_id}", response_model=views.ExecutionView, name=f"{name}.api_execution")
    async def api_execution(execution_id: str) -> views.ExecutionView:
        return await detail_data(execution_id)

    @router.get(
        "/executions/{execution_id}", response_class=HTMLResponse, name=f"{name}.execution", include_in_schema=False
    )
    async def execution_page(
        request: Request, execution_id: str, done: Optional[str] = None, error: Optional[str] = None
    ) -> HTMLResponse:
        v = await detail_data(execution_id)
        tokens = {a: form_token(execution_id, a) for a in acts.enabled()}
        return page(request, "execution.html", view=v, e=v.execution, done=done, error=error, tokens=tokens)

    # --- the failed queue, the silent ones, the backlog ----------------------------------------

    async def failed_data(after: Optional[str], limit: int) -> views.FailedView:
        s = await ready()
        return await views.failed_view(
            after=after or None, limit=min(limit, MAX_PAGE), stuck_after=stuck_after, doc=doc_of(s), hint=hint(s)
        )

    @router.get("/api/failed", response_model=views.FailedView, name=f"{name}.api_failed")
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

    @router.get("/api/backlog", response_model=views.BacklogView, name=f"{name}.api_backlog")
    async def api_backlog() -> views.BacklogView:
        return await backlog_data()

    @router.get("/backlog", response_class=HTMLResponse, name=f"{name}.backlog", include_in_schema=False)
    async def backlog_page(request: Request) -> HTMLResponse:
        return page(request, "backlog.html", view=await backlog_data(), statuses=queries.STATUSES)

    # --- actions (off unless the app turned them on) -------------------------------------------

    @router.post("/executions/{execution_id}/{action}", name=f"{name}.action", include_in_schema=False)
    async def act(
        request: Request, execution_id: str, action: str, confirm: str = Form(""), csrf: str = Form(""),
        kind: str = Form(""), data: str = Form(""), target_path: str = Form(""),
    ) -> Response:  # fmt: skip
        if action not in acts.enabled():
            raise HTTPException(403, f"the {action!r} action is not enabled on this dashboard")
        if not hmac.compare_digest(csrf, form_token(execution_id, action)):
            raise HTTPException(403, "the form is stale or was not served by this dashboard: reload the page")
        back = request.url_for(f"{name}.execution", execution_id=execution_id)
        if confirm.strip() != execution_id:
            return RedirectResponse(f"{back}?error=confirm+by+typing+the+execution+id", status_code=303)
        await ready()
        from harel.spec.states import Event

        try:
            if action == "send":
                payload = json.loads(data) if data.strip() else {}
                if not kind.strip() or not isinstance(payload, dict):
                    raise ValueError("an event needs a kind, and its data must be a JSON object")
                await acts.runner.send(execution_id, Event(kind=kind.strip(), data=payload))
            elif action == "cancel":
                await acts.runner.cancel(execution_id)
            else:
                if not target_path.strip():
                    raise ValueError("redrive needs the leaf state to resume in")
                await acts.runner.redrive(execution_id, target_path.strip())
        except (ValueError, KeyError) as exc:  # harel's refusals (and bad input) go back to the page
            from urllib.parse import quote

            return RedirectResponse(f"{back}?error={quote(str(exc)[:300])}", status_code=303)
        return RedirectResponse(f"{back}?done={action}", status_code=303)

    # --- Prometheus --------------------------------------------------------------------------

    if metrics is not None:

        @router.get("/metrics", name=f"{name}.metrics", include_in_schema=False)
        async def metrics_endpoint() -> Response:
            from prometheus_client import CONTENT_TYPE_LATEST

            s = await ready()
            await metrics.refresh(doc=doc_of(s), stuck_after=stuck_after)
            return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return router
