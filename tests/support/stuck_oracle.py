"""The stuck set by the documented definition, computed from the raw documents, and the check
that what the views list equals it.

Why this module exists: the views read the stuck executions through candidates (the `quiet`
index, the timer bound, the documents marked for the fold) and check each by
`harel_beanie.core.stuck`. Checking them against that same module would prove nothing: a
stale bound, a `quiet` left unset or a wrong comparison would hold on both sides. So the
definition is written here again, from docs/dashboard.md ("Stuck, or waiting") alone, reading
only what a document holds: its status, its last update, its timers and its pending entries
(the arrays themselves, not the flags or bounds kept beside them). It imports nothing of
`core.stuck`, on purpose.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

#: the message every stuck-set failure starts with (the planted-fault tests look for it)
STUCK_MISMATCH = "the views list as stuck"
#: the message every timer-bound failure starts with
BOUND_ABOVE = "a timer bound above an armed timer"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def stuck_by_definition(docs: Iterable[Mapping[str, Any]], *, after: float, now: float) -> set[Any]:
    """The ids of the documents stuck at `now` for a threshold of `after` seconds: RUNNING and
    either silent for longer than `after` with no timer armed and no outbox entry or spawn
    pending, or holding a timer that fell due longer than `after` ago."""
    out: set[Any] = set()
    for doc in docs:
        if "tomb" in doc or doc.get("status") != "RUNNING":
            continue
        fire_times = [float(at) for at in (doc.get("timers") or {}).values() if _number(at)]
        if any(now - at > after for at in fire_times):
            out.add(doc["_id"])  # a timer due this long ago: the sweep did not fire it
            continue
        waits = fire_times or doc.get("outbox") or doc.get("spawns")
        last = doc.get("updated_at")
        if not waits and _number(last) and now - float(last) > after:
            out.add(doc["_id"])  # silent, with nothing to wake it
    return out


def assert_stuck_set(shown: Iterable[Any], docs: Iterable[Mapping[str, Any]], *, after: float, now: float) -> None:
    """What a view lists as stuck equals the definition's set, both ways."""
    got, want = set(shown), stuck_by_definition(docs, after=after, now=now)
    assert got == want, (
        f"{STUCK_MISMATCH} {sorted(map(str, got))}, the documents say {sorted(map(str, want))} "
        f"(missing {sorted(map(str, want - got))}, extra {sorted(map(str, got - want))})"
    )


def assert_bounds(docs: Iterable[Mapping[str, Any]]) -> None:
    """Every document's timer bound is at or below each of its timers (else the sweep, which
    reads only bounds due, would not find the timer in time), and absent with no timer."""
    for doc in docs:
        fire_times = [float(at) for at in (doc.get("timers") or {}).values() if _number(at)]
        bound = doc.get("next_fire")
        if fire_times:
            assert _number(bound) and bound <= min(fire_times), (
                f"{BOUND_ABOVE}: {doc['_id']!r} has bound {bound!r}, timers {doc.get('timers')}"
            )
