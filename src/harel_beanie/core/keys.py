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

from harel_beanie.core.arguments import INT64_MIN, require_str

_DOT = "\uff0e"  # what harel's MongoStore writes for "."
_ESC = "\uff05"  # our escape; never produced for an ASCII path
_EMPTY = _ESC  # a lone escape is the empty path (Mongo refuses an empty path component)

# characters that can't stand in a field name as they are, with their escapes
_ESCAPED = {_ESC: "25", _DOT: "2E", "$": "24", "\x00": "00"}
_UNESCAPED = {code: ch for ch, code in _ESCAPED.items()}


def encode_path(path: str) -> str:
    """The `timers` field name for a node path: no `.`, no leading `$`, no NUL, never empty."""
    path = require_str("path", path)
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


#: Matches every seq: on a `<array>.seq` index it selects exactly the documents holding
#: entries (an empty array indexes no number), without touching the rest.
ANY_SEQ = {"$gte": INT64_MIN}

#: Matches every timer bound (`next_fire`, a finite number): the filter of the partial timer
#: index, so a sweep's `{"next_fire": {**ANY_TIME, "$lte": now}}` is one it may serve.
ANY_TIME = {"$gte": float("-inf")}


def prefix_range(prefix: str) -> dict[str, Any]:
    """A filter on `_id` matching exactly the strings that start with `prefix`.

    MongoDB orders strings by their UTF-8 bytes, which is code point order, so the ids
    starting with `prefix` are those from `prefix` up to, not including, `prefix` with its
    last code point raised by one. A range uses the `_id` index on every MongoDB; no pattern
    syntax is involved, so every character matches literally."""
    prefix = require_str("prefix", prefix)
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


def point(value: Any) -> dict[str, Any]:
    """An equality on `value` written as a one-element `$in`. mongod canonicalises it to the
    plain equality (the same plan: the `_id` index); SecantusDB's write path plans a filter
    of two plain equalities by walking its catalog of secondary indexes several times
    (compound, range and partial candidates) before it falls back to the `_id` lookup, and
    skips those walks for `$in` clauses: a state-only commit on this store's indexes costs
    about a fifth less there (bench/RESULTS.md)."""
    return {"$in": [value]}
