"""`/metrics` for Prometheus, served when the app passes a `StoreMetrics`: its figures are
refreshed from the database on each scrape.
"""

from __future__ import annotations

from fastapi import Depends
from fastapi.responses import Response

from harel_beanie.dashboard.context import Dashboard, dashboard


async def metrics_endpoint(dash: Dashboard = Depends(dashboard)) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    s = await dash.ready()
    await dash.metrics.refresh(doc=dash.doc(s), stuck_after=dash.stuck_after)
    return Response(dash.metrics.render(), media_type=CONTENT_TYPE_LATEST)
