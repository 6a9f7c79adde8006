"""The dashboard's guards: a token check for the standalone server, and an explicit "open".

Why this module exists: every page of the dashboard can show an execution's context (a
customer's data) and, when enabled, change an execution, so the router refuses to be built
without a guard. An app passes its own FastAPI dependency; these two are for the standalone
command and for apps that guard the mount point some other way.
"""

from __future__ import annotations

import hmac
from typing import Callable, Optional

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse

from harel_beanie.core.arguments import BadArgument, require_str

#: the cookie the standalone server sets once a request carried the right token in `?token=`
COOKIE = "harel_dashboard_token"


def no_auth() -> None:
    """A guard that lets every request through: say so deliberately."""
    return None


def presented_token(request: Request) -> Optional[str]:
    """The token a request carries: `Authorization: Bearer`, the cookie, or `?token=`."""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.cookies.get(COOKIE) or request.query_params.get("token")


def token_auth(token: str) -> Callable[[Request], None]:
    """A FastAPI dependency accepting only requests that carry `token` (compared in constant
    time); anything else gets 401."""
    token = require_str("token", token)
    if not token:
        raise BadArgument("token", "must not be empty: the dashboard token is what guards it")
    expected = token.encode()

    def check(request: Request) -> None:
        got = presented_token(request)
        if got is None or not hmac.compare_digest(got.encode(), expected):
            raise TokenRequired()

    return check


class TokenRequired(HTTPException):
    """The refusal of `token_auth`: 401, as JSON for a script, as a page saying how to get in
    for a browser (`login_page`)."""

    def __init__(self) -> None:
        super().__init__(
            status_code=401, detail="a valid dashboard token is required", headers={"WWW-Authenticate": "Bearer"}
        )


#: what a browser without the token is shown: no style, no script, nothing of the dashboard's
LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>harel dashboard: token required</title></head>
<body>
<h1>This dashboard needs its token</h1>
<p>Open the link <code>harel-beanie dashboard</code> printed when it started
(<code>http://HOST:PORT/?token=...</code>): the browser then keeps the token in a cookie, and
every page opens. The token stays the same when the dashboard is started again in the same
folder (it is kept in the data folder, beside the embedded server's data), so a link printed
earlier still works unless it was rotated with <code>--new-token</code>.</p>
<p>Started with <code>--token</code> or <code>HAREL_DASHBOARD_TOKEN</code>? Add
<code>?token=</code> and that token to this address. Scripts send
<code>Authorization: Bearer &lt;token&gt;</code>.</p>
</body></html>
"""


def login_page(request: Request, exc: Exception) -> Optional[HTMLResponse]:
    """The page a browser gets for `TokenRequired` (None: a script, answered with the JSON).
    A browser is a request whose `Accept` names HTML; `Accept: application/json`, or none,
    keeps the JSON."""
    if not isinstance(exc, TokenRequired) or "text/html" not in request.headers.get("accept", ""):
        return None
    return HTMLResponse(LOGIN_PAGE, status_code=401, headers=exc.headers)
