"""How large a stored execution may grow, in bytes: the budget of the execution's own JSON
and what the store keeps for itself beside it (trace ring, dedupe window).

It exists apart from the commit plan because the bounds are one rule read in several places:
the commit (which stores a trace step or an event id in bounded form, and refuses an
execution over its budget before sending), the settings (which check a configured ring
against the server's limit) and the error that names what is large. A document must never
be wedged by the store's own additions: each addition has a bound in bytes, and the
execution's JSON gets what is left of the server's 16 MiB. Pure, no I/O.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from harel_beanie.core.arguments import BadArgument, BadArgumentType

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
"""MongoDB's limit on one document."""

DEFAULT_TRACE_STEP_BYTES = 16 * 1024
"""The most one stored trace step takes; a larger step is slimmed (`bounded_step`)."""

MAX_TRACE_RING_BYTES = 8 * 1024 * 1024
"""The most a trace ring may be configured to take (`trace_max` x `trace_step_bytes`)."""

KEEP_ALL_RING_BYTES = 4 * 1024 * 1024
"""With `trace_max=0` ("keep every step", as harel means it) the ring keeps as many of the
latest steps as fit in this many bytes."""

MAX_EVENT_ID_BYTES = 128
"""A processed event id longer than this (UTF-8) is remembered by its SHA-256 digest."""

_DEDUPE_ITEM_BYTES = 8 + MAX_EVENT_ID_BYTES  # BSON: type, index key, length, NUL, the id
_TRACE_ITEM_OVERHEAD = 24  # BSON around one ring entry's text
_HEADROOM = 256 * 1024  # promoted fields, timers, tokens, field names: far less than this


def ring_length(trace_max: int, trace_step_bytes: int) -> int:
    """How many steps the trace ring keeps."""
    return trace_max or max(1, KEEP_ALL_RING_BYTES // trace_step_bytes)


def reserved_bytes(trace_max: int, trace_step_bytes: int, dedupe_window: int) -> int:
    """What the store may keep for itself in one document, at most: the full trace ring,
    the full dedupe window and headroom for everything else it adds."""
    ring = ring_length(trace_max, trace_step_bytes) * (trace_step_bytes + _TRACE_ITEM_OVERHEAD)
    return ring + dedupe_window * _DEDUPE_ITEM_BYTES + _HEADROOM


def data_budget(trace_max: int, trace_step_bytes: int, dedupe_window: int) -> int:
    """The most the execution's own JSON (`data`) may take: the server's limit less what
    the store reserves for itself, so the store's additions never push a document over."""
    return MAX_DOCUMENT_BYTES - reserved_bytes(trace_max, trace_step_bytes, dedupe_window)


def dedupe_keys(event_id: str) -> list[str]:
    """The forms an event id may be remembered under: the id itself when short, else its
    digest (what this store writes) and the id (what harel's store wrote)."""
    if len(event_id.encode("utf-8", "surrogatepass")) <= MAX_EVENT_ID_BYTES:
        return [event_id]
    return [dedupe_key(event_id), event_id]


def dedupe_key(event_id: str) -> str:
    """What the dedupe window stores for an event id: bounded in bytes whatever the id."""
    raw = event_id.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_EVENT_ID_BYTES:
        return event_id
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def strict_json(what: str, value: Any) -> str:
    """`value` as JSON, refusing NaN and infinities: JSON has no such numbers, and harel's
    own serialisation would silently store them as null."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False, default=str)
    except ValueError as exc:
        if "Circular" in str(exc):
            raise BadArgument(what, "refers to itself, which JSON can't hold") from None
        raise BadArgument(what, "holds a NaN or infinite number, which can't be stored") from None
    except TypeError as exc:  # a key JSON can't hold (a tuple, say)
        raise BadArgument(what, f"can't be stored as JSON: {exc}") from None
    except RecursionError:
        raise BadArgument(what, "is nested too deeply to store") from None


def trace_item(step: dict[str, Any], max_bytes: int, what: str = "trace") -> dict[str, Any]:
    """A trace step as stored: its JSON text, because a user's context keys may hold `.` or
    start with `$`, which a BSON field name inside `$push` must not. `what` names the argument
    the step came in (a step that is not a dict, or holds a NaN, is refused naming it)."""
    if not isinstance(step, dict):
        raise BadArgumentType(what, "a dict (a trace step)", step)
    return {"t": bounded_step(step, max_bytes, what)}


def bounded_step(step: dict[str, Any], max_bytes: int, what: str = "the trace step") -> str:
    """The step's JSON, at most `max_bytes`. A larger step (harel puts the whole context in
    every step) keeps its small fields (event kind, paths, actions, timestamp) and has its
    largest values replaced, largest first, by `{"omitted_bytes": n}` until it fits; a
    step that still does not fit keeps only that it was omitted."""
    text = strict_json(what, step)
    if len(text.encode()) <= max_bytes:
        return text
    sizes = {k: len(strict_json(what, v).encode()) for k, v in step.items()}
    slim = dict(step)
    for key in sorted(sizes, key=sizes.__getitem__, reverse=True):
        slim[key] = {"omitted_bytes": sizes[key]}
        text = json.dumps(slim, separators=(",", ":"))
        if len(text.encode()) <= max_bytes:
            return text
    return json.dumps({"omitted_bytes": sum(sizes.values())})
