"""The failed queue, keyset-paged, with the running executions gone silent for longer than the
dashboard's `stuck_after`; as a page and as JSON.
"""

from __future__ import annotations

from typing import Optional

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse

from harel_beanie.dashboard import views
from harel_beanie.dashboard.context import Dashboard, Limit, dashboard


async def failed_data(dash: Dashboard, after: Optional[str], limit: int) -> views.FailedView:
    s = await dash.ready()
    return await views.failed_view(
        after=after or None, limit=limit, stuck_after=dash.stuck_after, doc=dash.doc(s), hint=dash.hint()
    )


async def api_failed(
    after: Optional[str] = None, limit: Limit = None, dash: Dashboard = Depends(dashboard)
) -> views.FailedView:
    return await failed_data(dash, after, dash.limit(limit))


async def failed_page(
    request: Request, after: Optional[str] = None, limit: Limit = None, dash: Dashboard = Depends(dashboard)
) -> HTMLResponse:
    return dash.page(request, "failed.html", view=await failed_data(dash, after, dash.limit(limit)))
