"""Ages and cut-offs as an operator types them (`30d`, `12h`, `2026-01-31`, `@1700000000`).

Why this module exists: `prune --finished-before` and `prune --ttl` remove data by age, so
their text is read by one rule, here, light enough for the command line to refuse a wrong
value before it imports the store. An age must carry its unit: `30` could mean 30 seconds or
30 days, and the wrong guess removes nearly every finished execution.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Optional

from harel_beanie.core.arguments import BadArgument, parse_number, require_seconds, require_str, require_time

#: the oldest cut-off an age may name: a century (a larger one is a typing slip, not a policy)
MAX_AGE = 100 * 365.25 * 86400.0
#: the units an age takes, in seconds
UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
#: how the units are named in a refusal
UNIT_NAMES = "s (seconds), m (minutes), h (hours), d (days) or w (weeks)"
_AGE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*")


def parse_age(text: str) -> float:
    """`90s`, `15m`, `12h`, `30d`, `2w` as seconds: finite, and at most `MAX_AGE`. A number
    without its unit is refused, naming the units."""
    text = require_str("text", text)
    m = _AGE.fullmatch(text)
    if not m:
        raise BadArgument("age", f"is not an age: {text[:100]!r} (expected e.g. 30d, 12h, 90m)")
    number, unit = m.groups()
    if not unit:
        raise BadArgument(
            "age", f"{number} has no unit: write {number}d for days, {number}h for hours (units: {UNIT_NAMES})"
        )
    return require_seconds("age", float(number) * UNITS[unit], high=MAX_AGE)


def parse_before(text: str, now: Optional[float] = None) -> float:
    """The cut-off as epoch seconds: an age (`30d`: finished more than 30 days ago), an ISO
    date or date-time (`2026-01-31`, `2026-01-31T12:00:00+00:00`; UTC unless it says), or
    `@<epoch seconds>`."""
    now = time.time() if now is None else require_time("now", now)
    text = require_str("text", text).strip()
    if text.startswith("@"):
        return parse_number("finished_before", text[1:])
    if re.fullmatch(r"[\d.]+\s*[smhdw]?", text):
        return now - parse_age(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadArgument(
            "finished_before", f"{text[:100]!r}: expected an age (30d, 12h), an ISO date or @epoch"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()
