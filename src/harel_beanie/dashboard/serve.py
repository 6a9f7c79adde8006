"""`harel-beanie dashboard`: the dashboard router in an app of its own, served by uvicorn.

Why this module exists: a newcomer who ran `make demo` should see those executions in a
browser with one command, and an operator without a FastAPI app of their own should still
get the pages. It builds a FastAPI app around `dashboard_router` on the command's `Target`
(the embedded server when no URL is given: the CLI resolves it through
`harel_beanie.deploy.where`, as for `status`), guards it with a token, and serves `/metrics`.

The token: `--token`, else `HAREL_DASHBOARD_TOKEN`, else the one kept in the data folder
(`tokens.py`: drawn at the first start, kept across restarts, `--new-token` rotates it),
printed with the URL to open. A request carrying it as `?token=` gets it back as an
HttpOnly, SameSite=Strict cookie, so the link printed once is all a browser needs; scripts
send `Authorization: Bearer <token>`. A browser without it is answered 401 with a page saying
how to get in, a script with the JSON. Every path of the app is the dashboard's, behind the token
and with its security headers: FastAPI's default `/docs` and `/redoc` (an inline script and
a CDN on the origin whose cookie carries the token) are left out, and the OpenAPI schema is
served at `/openapi.json` behind the token. The actions' forms are signed with a key derived
from the token, so every process serving one token takes the forms any of them served.

Actions are off unless `--allow` names them (`send`, `cancel`, `redrive`, `terminate`,
`suspend`, `resume`, comma-separated); they need `--definitions` (harel's runner needs the
machines) and go through harel's `AsyncDistributedRunner` onto the Mongo transport: a sent
event is queued for the workers to process.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse

from harel_beanie.core.errors import ConfigError
from harel_beanie.dashboard.acting import ACTIONS
from harel_beanie.dashboard.auth import COOKIE, TokenRequired, login_page, token_auth
from harel_beanie.dashboard.router import DashboardActions, dashboard_router
from harel_beanie.dashboard.security import SecurityHeaders, server_error
from harel_beanie.deploy.where import Target


def parse_allow(text: Optional[str]) -> list[str]:
    names = [a.strip() for a in (text or "").split(",") if a.strip()]
    unknown = [a for a in names if a not in ACTIONS]
    if unknown:
        raise ConfigError(f"--allow: unknown action(s) {', '.join(unknown)}; choose from {', '.join(ACTIONS)}")
    return names


def build_app(
    target: Target,
    *,
    token: str,
    allow: list[str] = [],
    definitions_dir: Optional[str] = None,
    stuck_after: float = 300.0,
    say: Callable[[str], None] = print,
) -> FastAPI:
    """The standalone app: the dashboard at `/`, guarded by `token`, with `/metrics`."""
    from harel_beanie.telemetry.metrics import StoreMetrics, new_registry

    if allow and not definitions_dir:
        raise ConfigError("--allow needs --definitions DIR: harel's runner needs the machines to act on executions")
    definitions = _definitions(definitions_dir)
    held: dict[str, Any] = {}
    # no default docs routes: each would be a door the token does not guard
    app = FastAPI(
        title="harel-beanie dashboard",
        lifespan=_lifespan(target, held, definitions, bool(allow)),
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    guard = token_auth(token)
    actions = DashboardActions(runner=_LateRunner(held), **{a: True for a in allow}) if allow else None
    router = dashboard_router(
        lambda: held["store"],
        auth=guard,
        actions=actions,
        metrics=StoreMetrics(new_registry()),
        stuck_after=stuck_after,
        title=f"{target.db}/{target.prefix}",
        definitions=definitions,
        secret=form_secret(token),
    )
    app.include_router(router)

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(guard)])
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    app.middleware("http")(_token_to_cookie(token))
    app.add_middleware(SecurityHeaders)  # added last, so outermost: the redirect above gets them too
    app.add_exception_handler(Exception, server_error)
    app.add_exception_handler(TokenRequired, _refused)  # for /openapi.json (the router's routes answer it themselves)
    return app


async def _refused(request: Request, exc: Exception) -> Response:
    """A request without the token, outside the router: the page for a browser, else JSON."""
    assert isinstance(exc, TokenRequired)
    page = login_page(request, exc)
    return page or JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def _definitions(directory: Optional[str]) -> Optional[dict[str, Any]]:
    """The machines the pages draw and the actions run: those in `directory`, else the shop
    models shipped in the package (so the demo's executions get their diagrams)."""
    from harel_beanie.deploy.loader import default_models_dir, load_models

    if directory:
        try:
            return load_models(directory)
        except FileNotFoundError as exc:
            raise ConfigError(str(exc)) from None
    return load_models(default_models_dir()) if default_models_dir().is_dir() else None


def _lifespan(target: Target, held: dict[str, Any], definitions: Any, acts: bool) -> Any:
    """The app's lifespan: the store (and, when it `acts`, a runner over the transport) opened
    on uvicorn's loop, where they are used, into `held`; closed when the app stops."""
    from harel_beanie.deploy.stack import open_store, open_transport

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await open_store(target, create_schema=False)
        held["store"] = store
        transport = None
        if acts:
            from harel.engine.aio.distributed import AsyncDistributedRunner

            transport = await open_transport(target, create_schema=False)
            held["runner"] = AsyncDistributedRunner(store, transport, definitions)
        try:
            yield
        finally:
            await store.close()
            close = getattr(transport, "close", None)
            if close is not None:
                result = close()
                if hasattr(result, "__await__"):
                    await result

    return lifespan


def _token_to_cookie(token: str) -> Callable[[Request, Callable[[Request], Any]], Any]:
    """The middleware keeping the token of the link printed at start (`?token=`) in a cookie,
    and dropping it from the address bar (and so from the browser's history) by a redirect."""

    async def remember_token(request: Request, call_next: Callable[[Request], Any]) -> Response:
        given = request.query_params.get("token")
        if given and secrets.compare_digest(given.encode(), token.encode()) and request.method == "GET":
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            url = request.url.replace_query_params(**dict(rest)) if rest else request.url.remove_query_params("token")
            response: Response = RedirectResponse(str(url), status_code=303)
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
            return response
        return await call_next(request)  # type: ignore[no-any-return]

    return remember_token


def form_secret(token: str) -> bytes:
    """The key of the actions' forms: derived from the token, so every process serving one
    token agrees on it, and a form cannot be forged without the token."""
    return hmac.new(token.encode(), b"harel-beanie dashboard action forms", hashlib.sha256).digest()


class _LateRunner:
    """The runner the app's lifespan builds, looked up when an action runs."""

    def __init__(self, held: dict[str, Any]) -> None:
        self._held = held

    def __getattr__(self, name: str) -> Any:
        return getattr(self._held["runner"], name)
