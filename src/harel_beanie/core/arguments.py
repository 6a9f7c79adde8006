"""The one rule for every value that comes in through a door: refused naming the argument, or
used as a literal value.

Why this module exists: the store's methods, the typed queries, `ExecutionFilter`, the command
line, the dashboard's parameters and the prune and migrate options all take values that end up
in a MongoDB filter, a sort, a limit, a template or a file. A dict there is a query operator
(`{"$ne": None}` as a parent id lists every child of every execution), a bool is an int to
Python and a NaN compares false with everything. Each door calls one of the checks below, so
there is one answer everywhere:

Rule 1. A value of the wrong type raises `BadArgumentType` (a `TypeError`); a value of the right
        type that cannot be used (out of range, not finite, not one of the choices, not valid
        text) raises `BadArgument` (a `ValueError`). Both messages start with the argument's
        name, and the name is kept on the error (`argument`), so a web route can answer 400
        with the message and a command line can print it as it is.
Rule 2. A value that passes is returned as a plain value of the checked type (a `str`
        subclass comes back as a `str`, an int as an `int`), which every caller then uses as a
        literal: compared with `==` or bounded with `$gt`/`$lt`, never spliced into syntax.
Rule 3. Nothing is coerced: "1" is not a number and 1 is not a str. A door reading text (a
        query string, a flag) parses it first with `parse_number`, which follows Rule 1 too.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional

#: MongoDB stores signed 64-bit integers; a larger Python int cannot reach the server.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class BadArgument(ValueError):
    """A value of the right type that cannot be used; `argument` names it."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument} {message}")
        self.argument = argument


class BadArgumentType(TypeError):
    """A value of the wrong type; `argument` names it."""

    def __init__(self, argument: str, expected: str, value: Any) -> None:
        super().__init__(f"{argument} must be {expected}, got {type(value).__name__}: {_shown(value)}")
        self.argument = argument


def _shown(value: Any) -> str:
    """The value as an error shows it: its repr, cut short (a hostile value may be huge)."""
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def require_str(what: str, value: Any) -> str:
    """`value` as a plain `str` if it is text BSON can hold. A dict or list would become a
    query operator; a lone surrogate cannot be encoded as UTF-8."""
    if not isinstance(value, str):
        raise BadArgumentType(what, "a str", value)
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadArgument(what, f"is not valid text (it holds a lone surrogate): {_shown(value)}") from None
    return str(value)  # a str subclass may override __eq__ or __hash__: use the text itself


def optional_str(what: str, value: Any) -> Optional[str]:
    """`require_str`, or None."""
    return None if value is None else require_str(what, value)


def require_bool(what: str, value: Any) -> bool:
    """`value` if it is a bool (1 and "true" are not)."""
    if not isinstance(value, bool):
        raise BadArgumentType(what, "a bool", value)
    return bool(value)


def require_int(what: str, value: Any, *, low: int = INT64_MIN, high: int = INT64_MAX) -> int:
    """`value` as a plain `int` if it is an int (not a bool) in `[low, high]`, which is at most
    the 64-bit range MongoDB stores."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadArgumentType(what, "an int", value)
    value = int(value)
    if not max(low, INT64_MIN) <= value <= min(high, INT64_MAX):
        if low <= INT64_MIN and high >= INT64_MAX:
            raise BadArgument(what, f"is outside the 64-bit range MongoDB stores: {_shown(value)}")
        raise BadArgument(what, f"must be from {low} to {high}, got {_shown(value)}")
    return value


def require_time(what: str, value: Any, *, infinite_ok: bool = False) -> float:
    """`value` as a float if it is a real number (an epoch time, a clock reading): never NaN,
    which matches nothing; infinite only where asked (harel sweeps "every timer" with inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadArgumentType(what, "a number", value)
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        raise BadArgument(what, f"must be {'a number' if infinite_ok else 'finite'}, got {_shown(value)}") from None
    if math.isnan(number) or (not infinite_ok and math.isinf(number)):
        raise BadArgument(what, f"must be {'a number' if infinite_ok else 'finite'}, got {_shown(value)}")
    return number


def require_seconds(what: str, value: Any, *, positive: bool = False, high: Optional[float] = None) -> float:
    """A finite duration in seconds: not negative (or, with `positive`, more than 0), and at most
    `high` when given."""
    seconds = require_time(what, value)
    if seconds < 0 or (positive and seconds == 0):
        raise BadArgument(what, f"must be {'more than 0' if positive else 'at least 0'}, got {_shown(value)}")
    if high is not None and seconds > high:
        raise BadArgument(what, f"must be at most {high:g} seconds, got {_shown(value)}")
    return seconds


def require_choice(what: str, value: Any, choices: Iterable[str]) -> str:
    """`value` if it is one of `choices` (compared as text)."""
    text = require_str(what, value)
    options = tuple(choices)
    if text not in options:
        raise BadArgument(what, f"must be one of {', '.join(options)}, got {_shown(value)}")
    return text


def parse_number(what: str, text: Any) -> float:
    """A finite number written as text (a query string, a command-line flag). "inf", "nan" and
    "1e309" are refused like any other word that is not a finite number."""
    raw = require_str(what, text)
    try:
        number = float(raw)
    except ValueError:
        raise BadArgument(what, f"must be a number, got {_shown(raw)}") from None
    if not math.isfinite(number):
        raise BadArgument(what, f"must be a finite number, got {_shown(raw)}")
    return number
