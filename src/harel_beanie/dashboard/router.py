"""`dashboard_router`: the dashboard as an `APIRouter`, built from the route table.

Why this module exists: it checks what the app passes (see the package docstring), builds the
one `Dashboard` the handlers are given (`context.py`), and declares each route of `routes.py`
on a router guarded by the app's `auth`, with `DashboardRoute` as the class of every route.
What the pages show is under `pages/` and `views.py`; this module only assembles.

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

from typing import Any, Callable, Mapping, Optional

from fastapi import APIRouter, Depends
from fastapi.datastructures import Default
from fastapi.responses import HTMLResponse, JSONResponse

from harel_beanie.core.arguments import require_int, require_seconds, require_str
from harel_beanie.dashboard.context import MAX_PAGE, Dashboard, DashboardActions, StoreArg
from harel_beanie.dashboard.routes import API, METRICS, PAGE, ROUTES, Route
from harel_beanie.dashboard.security import NOT_FOUND, REFUSED, DashboardRoute, FormSigner

#: the answers every JSON route declares besides its model
ERRORS: dict[int | str, dict[str, Any]] = {400: REFUSED, 404: NOT_FOUND}


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
    dash = Dashboard(
        store=store,
        name=name,
        title=title,
        page_size=page_size,
        stuck_after=stuck_after,
        actions=actions or DashboardActions(),
        forms=FormSigner(secret, name),
        metrics=metrics,
        definitions=definitions or {},
    )
    router = APIRouter(dependencies=[Depends(auth), Depends(dash.bind)], route_class=DashboardRoute)
    for route in ROUTES:
        if route.kind != METRICS or metrics is not None:
            declare(router, route, name)
    return router


def declare(router: APIRouter, route: Route, name: str) -> None:
    """One route of the table on the router, as its kind is served."""
    router.add_api_route(
        route.path,
        route.handler,
        methods=[route.method],
        name=f"{name}.{route.name}",
        include_in_schema=route.kind == API,
        response_class=HTMLResponse if route.kind == PAGE else Default(JSONResponse),
        responses=ERRORS if route.kind == API else None,
        deprecated=route.deprecated or None,
    )
