"""Live pages: the dashboard's one change feed (`harel_beanie.dashboard.live`), pushed to each
open page as server-sent events.
"""

from __future__ import annotations

from fastapi import Depends, Request
from fastapi.responses import Response, StreamingResponse

from harel_beanie.dashboard.context import Dashboard, dashboard


async def live_events(request: Request, dash: Dashboard = Depends(dashboard)) -> Response:
    s = await dash.ready()
    executions = dash.doc(s).get_pymongo_collection()
    wakeups = dash.feed.start(executions.database, executions.name)
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    events = dash.feed.events(wakeups, request.is_disconnected)
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)
