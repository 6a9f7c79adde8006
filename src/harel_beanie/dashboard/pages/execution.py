"""One execution: its state, context, children, pending outbox and spawns, timers and trace,
drawn on its statechart where its definition is known; as a page and as JSON.

An execution id travels in the query string (`/execution?id=...`), never in the path: any id
harel allows is opened by exactly the link the pages build (`harel_beanie.dashboard.links`).
The addresses by path older pages used answer still: the JSON one as before, the page by a
redirect to its address by query.
"""

from __future__ import annotations

from typing import Optional

from fastapi import Depends, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from harel_beanie import queries
from harel_beanie.dashboard import views
from harel_beanie.dashboard.acting import ACTIONS, offer
from harel_beanie.dashboard.context import Dashboard, dashboard
from harel_beanie.dashboard.render import when
from harel_beanie.dashboard.security import NotFound

#: what `/execution?error=` may show: the dashboard's own messages, by code
ACTION_ERRORS = {"confirm": "confirm by typing the execution id"}


async def detail(dash: Dashboard, execution_id: str) -> views.ExecutionView:
    """The execution's view, or NotFound (saying when it was purged, if it was), with the
    actions offered on it as it is now (`acting.offer`)."""
    s = await dash.ready()
    v = await views.execution_view(s, execution_id, doc=dash.doc(s), actions=[], definitions=dash.definitions)
    if v is None:
        tomb = await queries.purged(execution_id, doc=dash.doc(s))
        gone = f" (purged at {when(tomb.at)})" if tomb is not None else ""
        raise NotFound(f"no execution {execution_id!r}{gone}")
    v.actions, v.unavailable = offer(dash.actions.runner, dash.actions.enabled(), v.execution.status)
    return v


def shown(
    request: Request,
    dash: Dashboard,
    execution_id: str,
    v: views.ExecutionView,
    done: Optional[str],
    error: Optional[str],
) -> HTMLResponse:
    """The execution page, with a form token for each action offered."""
    tokens = {a: dash.forms.token(execution_id, a) for a in dash.actions.enabled()}
    return dash.page(request, "execution.html", view=v, e=v.execution, done=done, error=error, tokens=tokens)


async def api_execution(
    execution_id: str = Query(..., alias="id", description="the execution's id"),
    dash: Dashboard = Depends(dashboard),
) -> views.ExecutionView:
    return await detail(dash, execution_id)


async def api_execution_by_path(execution_id: str, dash: Dashboard = Depends(dashboard)) -> views.ExecutionView:
    """The same as /api/execution?id=...; an id holding `/`, `..` or nothing cannot travel in a path."""
    return await detail(dash, execution_id)


async def execution_page(
    request: Request,
    execution_id: str = Query(..., alias="id"),
    done: Optional[str] = None,
    error: Optional[str] = None,
    dash: Dashboard = Depends(dashboard),
) -> HTMLResponse:
    v = await detail(dash, execution_id)
    done = done if done in ACTIONS else None  # only ever one of the action names
    # only ever one of the dashboard's own messages: a link cannot put words on this page
    message = ACTION_ERRORS.get(error) if error is not None else None
    return shown(request, dash, execution_id, v, done, message)


async def execution_by_path(request: Request, execution_id: str, dash: Dashboard = Depends(dashboard)) -> Response:
    # the address older pages linked to: the same page, at its address by query
    return RedirectResponse(dash.links(request).to("execution", id=execution_id), status_code=307)
