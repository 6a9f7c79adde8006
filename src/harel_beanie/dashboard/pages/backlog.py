"""The backlog: executions by definition and status, the pending outbox and spawns and the
executions holding the oldest of them, due and next timers, the silent ones; as a page and as
JSON (what `harel-beanie status` shows).
"""

from __future__ import annotations

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse

from harel_beanie import queries
from harel_beanie.dashboard import views
from harel_beanie.dashboard.context import Dashboard, dashboard


async def backlog_data(dash: Dashboard, request: Request) -> views.BacklogView:
    s = await dash.ready()
    # the pending entries from the charts' newest sample (queries.samples): the page reads
    # no document holding one while a sample is at most a minute old
    view = await views.backlog_view(stuck_after=dash.stuck_after, show=20, doc=dash.doc(s), samples=dash.samples(s))
    links = dash.links(request)
    for row in (*view.oldest_outbox, *view.oldest_spawns):
        row.page = links.to("execution", id=row.id)  # where this dashboard shows the execution
    return view


async def api_backlog(request: Request, dash: Dashboard = Depends(dashboard)) -> views.BacklogView:
    return await backlog_data(dash, request)


async def backlog_page(request: Request, dash: Dashboard = Depends(dashboard)) -> HTMLResponse:
    return dash.page(request, "backlog.html", view=await backlog_data(dash, request), statuses=queries.STATUSES)
