"""How the dashboard's pages link to each other, for any execution id harel allows.

Why this module exists: an id is data, and may hold anything a str can (`/`, `?`, `#`, `%`,
`..`, spaces, quotes, any unicode, or nothing at all). In a path, some of those cannot travel
(`..` is resolved away by the browser, an empty segment vanishes, `/` splits the id), so
every link to an execution carries its id in the query string, percent-encoded whole
(`quote` with nothing left safe): the page reads back exactly the id the link was built from.
An id a browser shows as nothing (the empty one, or only blanks) would make a link with no
text to see or click: pages show a placeholder for it instead (`id_placeholder`).
"""

from __future__ import annotations

import unicodedata
from typing import Any, Optional
from urllib.parse import quote, urlencode

from fastapi import Request


class Links:
    """The links of one dashboard (its routes are named `<name>.<route>`), for one request."""

    def __init__(self, request: Request, name: str) -> None:
        self._request = request
        self._name = name

    def route(self, route: str, **params: Any) -> str:
        """The path of one of this dashboard's routes, wherever the app mounted it."""
        return self._request.url_for(f"{self._name}.{route}", **params).path

    def to(self, route: str, path: Optional[dict[str, Any]] = None, /, **query: Any) -> str:
        """The route's path (its `path` parameters filled in) with `query` (None values left
        out), each value percent-encoded whole."""
        given = {k: v for k, v in query.items() if v is not None}
        where = self.route(route, **(path or {}))
        return f"{where}?{urlencode(given, quote_via=quote, safe='')}" if given else where


def typed_id(execution_id: str) -> str:
    """The id as a person can type it to confirm an action: every character a text field
    cannot hold or a keyboard cannot type (controls, format characters, unassigned code
    points) written as its escape (`\\u0000`); the rest as it is. An id that is empty or only
    spaces is typed between double quotes (`""`), since a confirmation field is sent trimmed
    and never empty."""
    if not execution_id.strip():
        return f'"{execution_id}"'
    out = []
    for ch in execution_id:
        if unicodedata.category(ch)[0] == "C":
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
        else:
            out.append(ch)
    return "".join(out)


def id_placeholder(execution_id: str) -> Optional[str]:
    """What a page shows in place of an id a browser would render as nothing, so that its
    link has text to see and click: `(empty id)` for the empty id, `(blank id)` for one made
    only of spaces, line breaks and characters that print nothing (controls, format
    characters). None for any other id, which is shown as it is."""
    if not execution_id:
        return "(empty id)"
    if all(ch.isspace() or unicodedata.category(ch)[0] == "C" for ch in execution_id):
        return "(blank id)"
    return None
