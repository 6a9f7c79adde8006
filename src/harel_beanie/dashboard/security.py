"""What every response of the dashboard carries, and how a refused argument is answered.

Why this module exists: the dashboard shows customers' data to staff who may act on it, and
it is mounted in the app's own FastAPI app, whose middleware and error handlers are the
app's. So the router sets its own protections on each of its responses, in one place
(`DashboardRoute`, the route class of every route it declares):

- a Content-Security-Policy that allows scripts and styles only from the dashboard's own
  files (no 'unsafe-inline', no eval), no framing (`frame-ancestors 'none'`), forms posted
  only to this origin;
- `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer` (an execution id in a
  URL never leaks to another site), and `Cache-Control: no-store` on everything that shows
  execution data (only the static files may be cached);
- a value refused by `harel_beanie.core.arguments` answers 400 with its message (which names
  the argument), an unknown execution 404, a database of another layout 503 naming the
  command that brings it to this one: never a 500.

The answers the app's own handlers make for what a route raises (the guard's 401 or 403,
FastAPI's 422) are made by those same handlers, then given the headers too. An app this
package builds (`harel-beanie dashboard`) puts them on every answer of its own as well
(`SecurityHeaders`): an unknown path's 404, a wrong method's 405, a server error's 500.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import secrets
from typing import Any, Callable, Coroutine, Optional

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from harel_beanie.core.arguments import BadArgument, BadArgumentType
from harel_beanie.core.errors import SchemaMismatch
from harel_beanie.dashboard.auth import login_page

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    ]
)

_COMMON = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
}
PAGE_HEADERS = {**_COMMON, "Cache-Control": "no-store"}


def static_headers() -> dict[str, str]:
    """The headers of the dashboard's own script and styles: the same protections, cacheable."""
    return {**_COMMON, "Cache-Control": "public, max-age=3600"}


class ErrorOut(BaseModel):
    """What a refused request is told."""

    detail: str


REFUSED: dict[str, Any] = {"model": ErrorOut, "description": "a parameter was refused; `detail` names it"}
NOT_FOUND: dict[str, Any] = {"model": ErrorOut, "description": "no such execution"}


class NotFound(Exception):
    """No execution (or file) of that name: answered 404 with the message."""


class DashboardRoute(APIRoute):
    """A route of the dashboard: refused arguments answered 400, unknown ids 404, another
    layout 503, and the headers above on every response it makes, the app's own handlers'
    answers to what the route raised (its guard's refusals among them) included."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                response = await handler(request)
            except (BadArgument, BadArgumentType) as exc:
                response = JSONResponse({"detail": str(exc)}, status_code=400)
            except NotFound as exc:
                response = JSONResponse({"detail": str(exc)}, status_code=404)
            except SchemaMismatch as exc:
                response = JSONResponse({"detail": str(exc)}, status_code=503)
            except (HTTPException, RequestValidationError) as exc:
                response = login_page(request, exc) or await _apps_answer(request, exc)
            for header, value in PAGE_HEADERS.items():
                response.headers.setdefault(header, value)
            return response

        return guarded


async def _apps_answer(request: Request, exc: Exception) -> Response:
    """What the app's own exception handlers answer to `exc` (found as Starlette finds them:
    by status, then by class), so an app's login redirect or error page stays its own."""
    by_class, by_status = request.scope.get("starlette.exception_handlers", ({}, {}))
    handler = by_status.get(exc.status_code) if isinstance(exc, HTTPException) else None
    handler = handler or next((by_class[c] for c in type(exc).__mro__ if c in by_class), None)
    if handler is None:
        raise exc
    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None)):
        return await handler(request, exc)  # type: ignore[no-any-return]
    response = await run_in_threadpool(handler, request, exc)  # a plain function, as Starlette runs it
    return await response if inspect.isawaitable(response) else response  # type: ignore[no-any-return]


class SecurityHeaders:
    """ASGI middleware giving every answer of an app the headers above (those an answer set
    itself, as the static files' caching, stay): for an app this package builds, whose every
    path is the dashboard's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                extra = [
                    (k.lower().encode(), v.encode()) for k, v in PAGE_HEADERS.items() if k.lower().encode() not in have
                ]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


def server_error(request: Request, exc: Exception) -> Response:
    """The answer to an unhandled error (given outside every middleware: the headers are
    set here)."""
    return PlainTextResponse("Internal Server Error", status_code=500, headers=PAGE_HEADERS)


class FormSigner:
    """The token an action's form carries: an HMAC of (the dashboard's name, the execution id,
    the action) under a key. Every process serving one app must share the key (`secret`, 16
    bytes or more) to take the forms the others served; without one, a key is drawn here, which
    serves an app of one process. The name keeps two dashboards of one app, under one key,
    from taking each other's forms."""

    def __init__(self, secret: Optional[bytes], name: str) -> None:
        if secret is None:
            secret = secrets.token_bytes(32)
        elif not isinstance(secret, bytes):
            raise TypeError(f"dashboard_router: secret must be bytes, not {type(secret).__name__}")
        elif len(secret) < 16:
            raise ValueError("dashboard_router: secret must be at least 16 bytes")
        self._key = secret
        self._name = name

    def token(self, execution_id: str, action: str) -> str:
        signed = f"{self._name}\0{execution_id}\0{action}".encode("utf-8", "surrogatepass")
        return hmac.new(self._key, signed, hashlib.sha256).hexdigest()

    def valid(self, token: str, execution_id: str, action: str) -> bool:
        return hmac.compare_digest(token.encode(), self.token(execution_id, action).encode())
