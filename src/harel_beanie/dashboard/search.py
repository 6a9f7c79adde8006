"""What the executions page searches by, as the query string carries it: shareable URLs.

Why this module exists: an operator searches by id prefix, definition, status, outcome,
parent, roots only, and a time range (updated within the last N seconds, or from / to an
instant), and shares the page's address; the HTML form, the JSON twin and the links between
pages must read and write those parameters alike. Every value goes through
`harel_beanie.core.arguments` (and `ExecutionFilter` checks every field again when built).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import Any, Optional

from harel_beanie import queries
from harel_beanie.core.arguments import BadArgument, parse_number, require_seconds, require_time

#: the widest `within` a listing takes: ten years, in seconds
MAX_WITHIN = 10 * 365.25 * 86400.0


def parse_within(text: Optional[str]) -> Optional[float]:
    """`within` as the list pages take it: empty for no bound (a form's "any time"), else a
    finite number of seconds above 0 and at most `MAX_WITHIN`."""
    if text is None or text == "":
        return None
    return require_seconds("within", parse_number("within", text), positive=True, high=MAX_WITHIN)


def parse_instant(what: str, text: Optional[str]) -> Optional[float]:
    """An instant as a form or a URL gives it: empty for none, epoch seconds, or an ISO date or
    date-time (UTC unless it says otherwise, as `datetime-local` inputs send it)."""
    if text is None or text.strip() == "":
        return None
    raw = text.strip()
    try:
        return require_time(what, float(raw))
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise BadArgument(what, f"must be an ISO date-time or epoch seconds, got {raw[:80]!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


@dataclass
class Search:
    """One search, as the page's query string holds it (empty strings: no filter)."""

    prefix: str = ""
    definition: str = ""
    status: str = ""
    outcome: str = ""
    parent: str = ""
    roots: bool = False
    within: str = ""
    since: str = ""  # the form's `from`
    until: str = ""  # the form's `to`

    def to_filter(self, now: Optional[float] = None) -> queries.ExecutionFilter:
        seconds = parse_within(self.within)
        after = parse_instant("from", self.since)
        if seconds is not None:
            recent = (time.time() if now is None else now) - seconds
            after = recent if after is None else max(after, recent)
        return queries.ExecutionFilter(
            definition_id=self.definition or None,
            status=self.status or None,
            outcome=self.outcome or None,
            parent_id=self.parent or None,
            roots_only=self.roots,
            updated_after=after,
            updated_before=parse_instant("to", self.until),
            id_prefix=self.prefix or None,
        )

    def params(self, **extra: Any) -> dict[str, Any]:
        """The query string that gives this search again (and `extra`), empty values left out."""
        names = {"since": "from", "until": "to"}
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value:
                out[names.get(f.name, f.name)] = "true" if value is True else value
        return {**out, **{k: v for k, v in extra.items() if v is not None}}
