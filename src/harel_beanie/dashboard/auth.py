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
            raise HTTPException(
                status_code=401, detail="a valid dashboard token is required", headers={"WWW-Authenticate": "Bearer"}
            )

    return check
