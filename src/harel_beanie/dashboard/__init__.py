"""A web dashboard for the store, as a FastAPI `APIRouter` the app includes in its own app.

Why this package exists: an app already on FastAPI and Beanie wants to see its statecharts
where it already serves its pages, not run another server. Three lines:

    from harel_beanie.dashboard import dashboard_router
    app.include_router(dashboard_router(store, auth=require_staff), prefix="/ops/harel")

`store` is the app's `AsyncMongoStore` (or a zero-argument function returning it, for a
store built later, in a lifespan). `auth` is a FastAPI dependency of the app's own: it runs
before every page, JSON endpoint and action, and refuses by raising `HTTPException`.
There is no default: pass `no_auth` to say deliberately that the pages are open (say,
behind a gateway that already checks). `harel-beanie dashboard` serves it standalone with a
token (`token_auth`).

What it serves, each page in HTML and the same data as JSON under `/api/...` (with declared
response models, so the app's OpenAPI schema documents them): the executions list
(filterable, keyset-paged, counts per status), one execution (state, context, children,
pending outbox and spawns, timers with their lateness, trace timeline), the failed queue
with the running-but-silent executions, and the backlog; `/metrics` for Prometheus when a
`StoreMetrics` is passed. Actions (send an event, cancel, redrive a failed execution) go
through harel's own runner and are off unless `DashboardActions` turns each on.

FastAPI, Jinja2 and prometheus-client come with the `dashboard` extra:
`pip install 'harel-beanie[dashboard]'`.
"""

from harel_beanie.dashboard.auth import no_auth, token_auth
from harel_beanie.dashboard.router import DashboardActions, dashboard_router

__all__ = ["dashboard_router", "DashboardActions", "token_auth", "no_auth"]
