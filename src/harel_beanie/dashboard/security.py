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
  the argument), and an unknown execution 404: never a 500.
"""

from __future__ import annotations

from typing import Any, Callable, Coroutine

from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.requests import Request

from harel_beanie.core.arguments import BadArgument, BadArgumentType

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
    """A route of the dashboard: refused arguments answered 400, unknown ids 404, and the
    headers above on every response it makes (the app's own error handlers keep answering what
    the app raises, its guard's refusals among them)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                response = await handler(request)
            except (BadArgument, BadArgumentType) as exc:
                response = JSONResponse({"detail": str(exc)}, status_code=400)
            except NotFound as exc:
                response = JSONResponse({"detail": str(exc)}, status_code=404)
            for header, value in PAGE_HEADERS.items():
                response.headers.setdefault(header, value)
            return response

        return guarded
