"""The front page: the executions list (filterable, keyset-paged, counts per status) with the
charts of the last hour, and the same list and charts as JSON.
"""

from __future__ import annotations

from typing import Literal, Optional, get_args

from fastapi import Depends, Query, Request
from fastapi.responses import HTMLResponse

from harel_beanie import queries
from harel_beanie.dashboard import views
from harel_beanie.dashboard.charts import ChartsOut, charts, sparkline
from harel_beanie.dashboard.context import Dashboard, Limit, dashboard
from harel_beanie.dashboard.search import MAX_WITHIN, Search, parse_within

#: harel's statuses as the JSON route declares them (the HTML form also sends "" for any)
StatusName = Literal["PENDING", "RUNNING", "SUSPENDED", "CANCELLING", "DONE", "FAILED", "CANCELLED"]
assert get_args(StatusName) == queries.STATUSES  # one list of harel's statuses


async def list_data(dash: Dashboard, search: Search, after: Optional[str], limit: int) -> views.ExecutionsView:
    flt = search.to_filter()
    s = await dash.ready()
    return await views.executions_view(flt, after=after or None, limit=limit, doc=dash.doc(s), hint=dash.hint())


def _text(value: Optional[float]) -> str:
    return "" if value is None else repr(value)


# (the JSON routes' docstrings would be their descriptions in the app's OpenAPI schema)
async def api_executions(
    definition: Optional[str] = None,
    status: Optional[StatusName] = None,
    outcome: Optional[str] = None,
    parent: Optional[str] = None,
    roots: bool = False,
    prefix: Optional[str] = Query(None, description="ids starting with this, literally"),
    # declared as the rule has it, so the schema says what is refused (the search applies it)
    within: Optional[float] = Query(
        None, gt=0, le=MAX_WITHIN, allow_inf_nan=False, description="updated within this many seconds"
    ),
    updated_after: Optional[float] = Query(None, allow_inf_nan=False, description="epoch seconds, inclusive"),
    updated_before: Optional[float] = Query(None, allow_inf_nan=False, description="epoch seconds, exclusive"),
    after: Optional[str] = Query(None, description="the next_after of the previous page"),
    limit: Limit = None,
    dash: Dashboard = Depends(dashboard),
) -> views.ExecutionsView:
    search = Search(
        prefix or "",
        definition or "",
        status or "",
        outcome or "",
        parent or "",
        roots,
        _text(within),
        _text(updated_after),
        _text(updated_before),
    )
    return await list_data(dash, search, after, dash.limit(limit))


async def executions_page(
    request: Request,
    definition: str = "",
    status: str = "",
    outcome: str = "",
    parent: str = "",
    roots: bool = False,
    within: str = "",
    prefix: str = "",
    since: str = Query("", alias="from"),
    until: str = Query("", alias="to"),
    after: Optional[str] = None,
    limit: Limit = None,
    dash: Dashboard = Depends(dashboard),
) -> HTMLResponse:
    search = Search(prefix, definition, status, outcome, parent, roots, within, since, until)
    size = dash.limit(limit)
    data = await list_data(dash, search, after, size)
    s = await dash.ready()
    drawn = await charts(dash.samples(s), hint=dash.hint())
    params = search.params(limit=size if size != dash.page_size else None)
    return dash.page(
        request,
        "executions.html",
        view=data,
        params=params,
        statuses=queries.STATUSES,
        within=parse_within(within),
        search=search,
        charts=drawn,
        spark=sparkline,
    )


async def api_charts(dash: Dashboard = Depends(dashboard)) -> ChartsOut:
    s = await dash.ready()
    return await charts(dash.samples(s), hint=dash.hint())
