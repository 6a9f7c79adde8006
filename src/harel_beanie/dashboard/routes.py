"""The dashboard's routes, as one table: method, path, handler, name, and what kind of answer
each gives. This is the only place a route is declared (`router.py` builds the router from it).

The kinds: a `PAGE` is HTML, left out of the app's OpenAPI schema; an `API` route is JSON, in
the schema with its response model (the handler's return annotation) and its 400 and 404
answers; `OTHER` is any other answer (a redirect, a form's post, an event stream, a file),
left out of the schema; `METRICS` is served only when the app passes a `StoreMetrics`.
Names are given as `<the dashboard's name>.<name>`, the names `links.py` links by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from harel_beanie.dashboard.pages import actions, backlog, events, execution, failed, files, listing, prometheus

Kind = Literal["page", "api", "other", "metrics"]
PAGE: Kind = "page"
API: Kind = "api"
OTHER: Kind = "other"
METRICS: Kind = "metrics"


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable[..., Any]
    name: str
    kind: Kind
    deprecated: bool = False


ROUTES = (
    # the executions list, and the front page's charts
    Route("GET", "/api/executions", listing.api_executions, "api_executions", API),
    Route("GET", "/", listing.executions_page, "executions", PAGE),
    Route("GET", "/api/charts", listing.api_charts, "api_charts", API),
    # one execution (its id in the query string; the addresses by path older pages used)
    Route("GET", "/api/execution", execution.api_execution, "api_execution", API),
    Route(
        "GET",
        "/api/executions/{execution_id:path}",
        execution.api_execution_by_path,
        "api_execution_by_path",
        API,
        deprecated=True,
    ),
    Route("GET", "/execution", execution.execution_page, "execution", PAGE),
    Route("GET", "/executions/{execution_id:path}", execution.execution_by_path, "execution_by_path", OTHER),
    # the failed queue and the silent ones, the backlog
    Route("GET", "/api/failed", failed.api_failed, "api_failed", API),
    Route("GET", "/failed", failed.failed_page, "failed", PAGE),
    Route("GET", "/api/backlog", backlog.api_backlog, "api_backlog", API),
    Route("GET", "/backlog", backlog.backlog_page, "backlog", PAGE),
    # live pages, the script and the styles, the actions, Prometheus
    Route("GET", "/live", events.live_events, "live", OTHER),
    Route("GET", "/static/{filename}", files.static, "static", OTHER),
    Route("POST", "/execution/{action}", actions.act, "action", OTHER),
    Route("GET", "/metrics", prometheus.metrics_endpoint, "metrics", METRICS),
)
