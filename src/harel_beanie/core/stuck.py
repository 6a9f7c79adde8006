"""What "stuck" means, in one place, with no I/O: which RUNNING executions the backlog, the
failed page, `/metrics` and `harel-beanie status` list as stuck, and which are only waiting.

Why this module exists: "RUNNING and not updated for five minutes" counted every execution
waiting on a timer days ahead (an order waiting for its delivery, a payment waiting to
retry), and those are what a statechart store holds most of: at a million executions, 80,000
of them were read on every scrape, page and `status`. Waiting is not being stuck. So:

- **waiting**: a timer is armed and not long overdue (the sweep will fire it), or an outbox
  entry or spawn is pending (a relay will deliver it; the backlog shows how old the oldest
  is);
- **stuck**: RUNNING, and either silent for longer than the threshold with nothing to wake
  it (no timer armed, nothing pending: `quiet`), or holding a timer that fell due longer
  than the threshold ago (the sweep did not fire it).

How it is read without reading the waiting ones. Each execution document carries `quiet`
(its `updated_at`) exactly while it is RUNNING with no timer bound and nothing pending, except
while it is marked for the counts' fold (`cdirty`). Who keeps it so:

- a commit that may change what the counts count it as is marked for the fold, and clears
  `quiet`; the fold (`core.counting`, Rule 3) decides it from the document it read, and its
  mark lands only if the document is still as read (version, pending flag, timer bound);
- a commit that leaves the status as it was (sent pinned, `core.commit`) decides it itself,
  and is not marked: it knows the status it writes and whether it adds an entry or a timer
  (any of these: not quiet, whatever the document held); only a RUNNING execution it gives
  neither may be quiet, and then its filter pins what it assumed (nothing pending, no timer
  bound held) and it sets `quiet` to the `updated_at` it writes. A pin that does not hold
  makes it miss, and it is sent again marked for the fold. A commit that cancels a timer is
  marked (Rule T2): so `quiet` follows status changes and the writes that cannot know it,
  not every event;
- an ack, a timer's removal or the repair of its bound may make it wait on nothing without
  knowing the rest of the document: it is marked for the fold (one write where a pinned
  update would need to know the status, the other entries and the timers).

Stuck means stuck, whatever happened to the timers: the bound `next_fire` stands for the
timers above, so a bound left by a timer no longer armed would hide a silent execution (out
of `hb_quiet`, and not overdue) until its time. Two rules keep that from happening:

- **Rule T1** (the bound): `next_fire` is never above an armed timer's fire time (the sweep
  reads only bounds due), and every write that removes a timer leaves it at the earliest
  timer that write cannot rule out, or absent: as if the removed timer had never been
  armed. A commit with timer ops sets it from the timers it leaves (`core.commit`): the
  ones held at the version it loaded, less its cancels, with its schedules. Only commits
  arm timers, and the commit's filter admits it only at that version; between the load and
  the commit a timer is only ever removed (the sweep's removal of a fired one), so that set
  holds every timer armed after the write and the bound stays a lower bound, too low at
  most by a timer that fired since the load: due, so the next sweep repairs it. The sweep's
  removal of a fired timer sets the bound to the earliest timer left in the same write (a
  pipeline), and a sweep that finds a due bound with nothing due repairs it. A commit with
  no timer op leaves the bound as it is.
- **Rule T2** (`quiet` follows): every write that removes a timer (a commit with a cancel,
  the sweep's removal, a repair) is marked for the fold and clears `quiet`; the fold gives
  `quiet` exactly when `quiet_of` holds on the document it read (no bound left, nothing
  pending); until then the views read it among the marked documents and check it by
  `is_stuck`, on the timers themselves; and a bound left too low (Rule T1) is due, so the
  views read it among the due bounds until the sweep repairs it. So an execution whose last
  timer was cancelled is listed stuck by every view once silent past the threshold, before
  and after the fold.

The partial index `hb_quiet` holds only those documents, so the silent ones are a range of
it; the due timers and bounds (the long-overdue timers among them) are a range of the timer
index `hb_timer_pending`; and the
documents marked since the last fold are the few the counts read anyway (`hb_part_cdirty`).
Each candidate is then checked against its own fields (`is_stuck`): a bound may be stale, a
document may have moved since.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from harel_beanie.core.keys import ANY_TIME

#: the field: the document's `updated_at` while it waits on nothing (see the module)
QUIET = "quiet"
#: the partial index's filter, which every read of it names (its leading field: SecantusDB
#: may answer a read that does not name it from the partial index, wrongly)
QUIET_FILTER: dict[str, Any] = {QUIET: ANY_TIME}
#: what the candidates' rows need to be checked (`is_stuck`)
CHECK_FIELDS = ("status", "updated_at", "next_fire", "timers", "pending")


def quiet_of(doc: Mapping[str, Any]) -> Optional[float]:
    """The `quiet` a document should carry (its `updated_at`), or None: RUNNING, no timer
    bound, nothing pending. `next_fire` stands for the timers: it is kept whenever a timer
    is armed, and removed with the last one (Rule T1)."""
    at = doc.get("updated_at")
    if doc.get("status") != "RUNNING" or doc.get("pending") or "next_fire" in doc or "tomb" in doc:
        return None
    if not isinstance(at, (int, float)) or isinstance(at, bool):
        return None
    return float(at)


def quiet_expression() -> dict[str, Any]:
    """`quiet_of` as a server-side expression, for an update pipeline (the counts' build
    gives every document it counts its `quiet` in the same update)."""
    waits_on_nothing = {
        "$and": [
            {"$eq": ["$status", "RUNNING"]},
            {"$ne": ["$pending", True]},
            {"$eq": [{"$type": "$next_fire"}, "missing"]},
            {"$eq": [{"$type": "$tomb"}, "missing"]},
            {"$in": [{"$type": "$updated_at"}, ["double", "int", "long"]]},
        ]
    }
    return {"$cond": [waits_on_nothing, "$updated_at", "$$REMOVE"]}


def earliest_timer(doc: Mapping[str, Any]) -> Optional[float]:
    """The earliest armed timer's fire time, read from the timers themselves (not the
    bound, which may be too low: Rule T1), or None."""
    times = [float(v) for v in (doc.get("timers") or {}).values() if isinstance(v, (int, float))]
    return min(times, default=None)


def silent_for(doc: Mapping[str, Any], now: float) -> float:
    at = doc.get("updated_at")
    return now - float(at) if isinstance(at, (int, float)) else 0.0


def is_stuck(doc: Mapping[str, Any], *, after: float, now: float) -> bool:
    """Whether the execution `doc` (with `CHECK_FIELDS`) is stuck at `now` for a threshold
    of `after` seconds (see the module): RUNNING, and silent for longer than `after` with no
    timer armed and nothing pending, or holding a timer due for longer than `after`."""
    if doc.get("status") != "RUNNING":
        return False
    first = earliest_timer(doc)
    if first is not None:
        return first < now - after
    return not doc.get("pending") and silent_for(doc, now) > after


def quiet_query(after: float, now: float) -> dict[str, Any]:
    """The silent ones with nothing to wake them: a range of `hb_quiet`."""
    return {QUIET: {**ANY_TIME, "$lt": now - after}}


def due_query(now: float) -> dict[str, Any]:
    """The due bounds: a range of `hb_timer_pending`. It holds the timers due for longer than
    the threshold, and the bounds left too low by a timer removed since (Rule T1), which the
    sweep repairs at its next pass: a silent execution is read through them meanwhile. The
    timers due for less than the threshold among them are waiting (`is_stuck`); on a healthy
    deployment there are few, the sweep firing them as they fall due."""
    return {"next_fire": {**ANY_TIME, "$lte": now}}


def dirty_query(parts: int) -> dict[str, Any]:
    """The documents written since the last fold (their `quiet` not set yet): exactly the
    filter the exact counts read them by (Rule 4), the shape `hb_part_cdirty` serves. Their
    silence is checked on the rows: with a clause on `updated_at` beside it, SecantusDB
    0.7.0b3 scanned the collection, and answered nothing."""
    return {"part": {"$in": list(range(parts))}, "cdirty": True}


def stuck_rows(candidates: list[Mapping[str, Any]], *, after: float, now: float, show: int) -> list[dict[str, Any]]:
    """The stuck among `candidates` (each at most once), the most silent first, at most
    `show`: what every view lists."""
    seen: set[Any] = set()
    out: list[dict[str, Any]] = []
    for doc in candidates:
        if doc.get("_id") in seen or not is_stuck(doc, after=after, now=now):
            continue
        seen.add(doc.get("_id"))
        first = earliest_timer(doc)
        out.append(
            {
                "id": doc.get("_id"),
                "definition_id": doc.get("definition_id"),
                "active_path": doc.get("active_path"),
                "silent_for": silent_for(doc, now),
                "overdue_for": None if first is None else now - first,
            }
        )
    out.sort(key=lambda r: (-float(r["silent_for"]), str(r["id"])))
    return out[:show]
