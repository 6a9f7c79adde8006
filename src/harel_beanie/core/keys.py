"""How caller strings become MongoDB keys, filters and bounds, safely and reversibly.

Three things a caller hands the store end up inside MongoDB syntax rather than as plain
values, and each is a way to corrupt or query the wrong data if passed through raw:

- a timer's node path becomes a field name under `timers` (`Fork.A` would mean the sub-field
  `A` of `Fork`; a leading `$` is an operator);
- an id or event id becomes a filter value (a dict there would be an operator: injection);
- an id prefix becomes a range on `_id` (a regular expression would need escaping and cannot
  hold a NUL).

The timer-key encoding is harel's (`.` becomes the fullwidth full stop U+FF0E), extended to
be injective: harel's is lossy for a path that already holds U+FF0E. The escape character is
the fullwidth percent sign U+FF05, which harel's encoding leaves alone, so every key harel's
store wrote decodes as it did there.
"""

from __future__ import annotations

from typing import Any

_DOT = "\uff0e"  # what harel's MongoStore writes for "."
_ESC = "\uff05"  # our escape; never produced for an ASCII path
_EMPTY = _ESC  # a lone escape is the empty path (Mongo refuses an empty path component)

# characters that can't stand in a field name as they are, with their escapes
_ESCAPED = {_ESC: "25", _DOT: "2E", "$": "24", "\x00": "00"}
_UNESCAPED = {code: ch for ch, code in _ESCAPED.items()}


def encode_path(path: str) -> str:
    """The `timers` field name for a node path: no `.`, no leading `$`, no NUL, never empty."""
    require_str("timer path", path)
    if path == "":
        return _EMPTY
    out = []
    for ch in path:
        if ch == ".":
            out.append(_DOT)
        elif ch in _ESCAPED and (ch != "$" or not out):
            out.append(_ESC + _ESCAPED[ch])
        else:
            out.append(ch)
    return "".join(out)


def decode_path(key: str) -> str:
    """The node path a `timers` field name stands for (inverse of `encode_path`)."""
    if key == _EMPTY:
        return ""
    out, i = [], 0
    while i < len(key):
        ch = key[i]
        if ch == _DOT:
            out.append(".")
        elif ch == _ESC and key[i + 1 : i + 3] in _UNESCAPED:
            out.append(_UNESCAPED[key[i + 1 : i + 3]])
            i += 2
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def harel_timer_key(key: str) -> str:
    """The `timers` field name harel's store uses for the path `key` stands for. This store's
    encoding is harel's for every ordinary path; a path harel cannot store (empty, a leading
    `$`, a NUL) keeps this store's key."""
    path = decode_path(key)
    if not path or path.startswith("$") or "\x00" in path:
        return key
    return path.replace(".", _DOT)


def timer_field(path: str) -> str:
    """The dotted update path of a node's timer."""
    return "timers." + encode_path(path)


def require_str(what: str, value: Any) -> str:
    """`value` itself if it is a str that BSON can hold: a dict or list here would become a
    query operator, and a lone surrogate can't be encoded as UTF-8."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}: {value!r}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{what} is not valid text (it holds a lone surrogate): {value!r}") from None
    return value


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

#: Matches every seq: on a `<array>.seq` index it selects exactly the documents holding
#: entries (an empty array indexes no number), without touching the rest.
ANY_SEQ = {"$gte": INT64_MIN}

#: Matches every timer bound (`next_fire`, a finite number): the filter of the partial timer
#: index, so a sweep's `{"next_fire": {**ANY_TIME, "$lte": now}}` is one it may serve.
ANY_TIME = {"$gte": float("-inf")}


def require_int(what: str, value: Any) -> int:
    """`value` itself if it is an int that BSON can hold (a signed 64-bit integer)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}: {value!r}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"{what} is outside the 64-bit range MongoDB stores: {value}")
    return value


def prefix_range(prefix: str) -> dict[str, Any]:
    """A filter on `_id` matching exactly the strings that start with `prefix`.

    MongoDB orders strings by their UTF-8 bytes, which is code point order, so the ids
    starting with `prefix` are those from `prefix` up to, not including, `prefix` with its
    last code point raised by one. A range uses the `_id` index on every MongoDB; no pattern
    syntax is involved, so every character matches literally."""
    require_str("id prefix", prefix)
    if prefix == "":
        return {}
    stem = prefix
    while stem:
        last = ord(stem[-1]) + 1
        if 0xD800 <= last <= 0xDFFF:  # surrogates can't be encoded: skip past them
            last = 0xE000
        if last <= 0x10FFFF:
            return {"_id": {"$gte": prefix, "$lt": stem[:-1] + chr(last)}}
        stem = stem[:-1]  # every code point is the highest: no upper bound from this one
    return {"_id": {"$gte": prefix}}


def require_time(what: str, value: Any, *, infinite_ok: bool = False) -> float:
    """`value` as a float if it is a real number (a fire time, a clock reading): never NaN,
    which matches nothing; infinite only where asked (harel sweeps "every timer" with inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}: {value!r}")
    if value != value or (not infinite_ok and value in (float("inf"), float("-inf"))):
        raise ValueError(f"{what} must be {'a number' if infinite_ok else 'finite'}, got {value!r}")
    return float(value)
