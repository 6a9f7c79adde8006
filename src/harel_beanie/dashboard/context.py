"""What the dashboard's handlers take through FastAPI dependencies.

Why this module exists: the handlers under `pages/` are plain functions, one set per page,
shared by every dashboard an app mounts; what differs between two dashboards (the store, the
title, the page size, the actions turned on, the forms' key, the sampler and survey of its
database) is one `Dashboard`. Its router binds it to each request it serves, with a
dependency of the router itself (solved before any of the handler's own), and `dashboard`
hands it to a handler that asks for it: `dash: Dashboard = Depends(dashboard)`.

The store is set up through `Dashboard.ready`, called by each handler where it first needs
the database (after its parameters are checked, so a refused value never touches it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Mapping, Optional, Union

from fastapi import Query, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from harel_beanie.core.arguments import require_bool
from harel_beanie.core.documents import bind
from harel_beanie.core.errors import SchemaMismatch
from harel_beanie.dashboard import render
from harel_beanie.dashboard.acting import ACTIONS
from harel_beanie.dashboard.charts import Sampler, samples_name
from harel_beanie.dashboard.links import Links
from harel_beanie.dashboard.live import LiveFeed
from harel_beanie.dashboard.security import FormSigner
from harel_beanie.dashboard.survey import Surveyor

MAX_PAGE = 500
#: where a dashboard is kept in the scope of a request its router serves
SCOPE_KEY = "harel_beanie.dashboard"

#: the app's store, or a zero-argument function returning it (for a store built later)
StoreArg = Union[Any, Callable[[], Any]]


@dataclass
class DashboardActions:
    """Which actions the dashboard offers; each is off unless set. `runner` is the harel
    runner the app already uses: `AsyncDistributedRunner` (an event sent is queued for the
    workers), `AsyncDurableRunner` (an event is processed at once, in this process, by its
    `process`), or the sync `DistributedRunner` / `DurableRunner` (called in a worker thread).
    The dashboard calls the runner's own method for each action, so what they do and refuse is
    harel's; an action the runner has no method for is shown as unavailable, and one that does
    not apply to an execution's status is not offered on it (`acting.py`). Each action asks for
    a confirmation (the execution id typed again)."""

    runner: Any = None
    send: bool = False
    cancel: bool = False
    redrive: bool = False  # harel redrives FAILED executions only; offered on those
    terminate: bool = False  # cancel at once, without the model's cleanup
    suspend: bool = False
    resume: bool = False

    def enabled(self) -> list[str]:
        return [name for name in ACTIONS if getattr(self, name)]

    def __post_init__(self) -> None:
        for action in ACTIONS:  # 1 or "false" is not a switch: an action is on only when asked with True
            setattr(self, action, require_bool(action, getattr(self, action)))
        if self.enabled() and self.runner is None:
            raise ValueError("DashboardActions: an enabled action needs the harel runner to call (runner=...)")


@dataclass
class Dashboard:
    """One mounted dashboard: its settings (checked by `dashboard_router`) and its parts."""

    store: StoreArg
    name: str
    title: str
    page_size: int
    stuck_after: float
    actions: DashboardActions
    forms: FormSigner  # a cross-site form cannot know its key
    metrics: Any = None  # a StoreMetrics; without one, `/metrics` is not served
    definitions: Mapping[str, Any] = field(default_factory=dict)
    templates: Jinja2Templates = field(default_factory=render.templates)
    sampler: Sampler = field(default_factory=Sampler)
    surveyor: Surveyor = field(default_factory=Surveyor)
    feed: LiveFeed = field(default_factory=LiveFeed)  # one change feed, pushed to each open page

    def bind(self, request: Request) -> None:
        """The router's own dependency: this dashboard serves the request."""
        request.scope[SCOPE_KEY] = self

    async def ready(self) -> Any:
        """The store, set up, with the database surveyed (and sampled, once it holds the store)."""
        store = self.store
        s = store() if callable(store) and not hasattr(store, "read_trace") else store
        try:
            await s.init()  # idempotent: Beanie classes bound, layout checked
        except SchemaMismatch:
            pass  # Beanie is bound before the check: the lists still read, and the survey says why not all
        found = await self.surveyor(s.settings.prefix)
        if found.holds_store:  # a database without the store's data is left as it was found
            self.sampler.start(self.doc(s), self.samples(s))  # once: a sample a minute for the charts
        return s

    def doc(self, s: Any) -> Any:
        """The executions document class of the store's prefix."""
        return bind(s.settings.prefix)[0]

    def samples(self, s: Any) -> Any:
        """The collection the charts' samples are kept in."""
        executions = self.doc(s).get_pymongo_collection()
        return executions.database[samples_name(s.settings.prefix)]

    def hint(self) -> bool:
        """Whether reads may name their index: only where every index the reads name exists
        (the survey `ready` took): a hint naming a missing index is an error, not a slower read."""
        return self.surveyor.latest is not None and self.surveyor.latest.hint

    def page(self, request: Request, template: str, **context: Any) -> HTMLResponse:
        """A page rendered, with what every page shows (title, links, the survey's notice)."""
        links = Links(request, self.name)
        notice = self.surveyor.latest.notice() if self.surveyor.latest is not None else None
        shared = {"title": self.title, "u": links.route, "link": links.to, "read_at": time.time(), "notice": notice}
        return self.templates.TemplateResponse(request, template, {**shared, **context})

    def links(self, request: Request) -> Links:
        return Links(request, self.name)

    def limit(self, asked: Optional[int]) -> int:
        """How many rows a listing shows: the number asked for, or the page size."""
        return self.page_size if asked is None else asked


def dashboard(request: Request) -> Dashboard:
    """The dashboard whose router serves this request (see the module docstring)."""
    found = request.scope.get(SCOPE_KEY)
    if not isinstance(found, Dashboard):
        raise RuntimeError("a dashboard handler was served by a router that dashboard_router did not build")
    return found


#: the `limit` of a listing, as every listing declares it (`limit: Limit = None`)
Limit = Annotated[
    Optional[int], Query(ge=1, le=MAX_PAGE, description="rows on a page (the dashboard's page size when left out)")
]
