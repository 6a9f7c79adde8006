"""`/metrics` for Prometheus, served when the app passes a `StoreMetrics`: its figures are
refreshed from the database on each scrape, the pending entries' from the charts' newest sample
when it is at most a minute old.
"""

from __future__ import annotations

from fastapi import Depends
from fastapi.responses import Response

from harel_beanie.dashboard.charts import latest_sample
from harel_beanie.dashboard.context import Dashboard, dashboard


async def metrics_endpoint(dash: Dashboard = Depends(dashboard)) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    s = await dash.ready()
    # the pending entries from the dashboard's sample when one is at most a minute old: they
    # read every document holding one, and a scrape comes every few seconds
    sampled = await latest_sample(dash.samples(s))
    await dash.metrics.refresh(doc=dash.doc(s), stuck_after=dash.stuck_after, sampled=sampled)
    return Response(dash.metrics.render(), media_type=CONTENT_TYPE_LATEST)
