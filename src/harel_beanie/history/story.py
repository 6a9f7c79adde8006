"""One event's story in a recorded history: every record that names it, beside the faults
injected meanwhile, in time order.

Why this module exists: the checker says that an event was lost or doubled; what its reader
needs next is when it was sent, published, handed to a worker and acknowledged, and which
fault was acting then. A fault run that fails where nobody can look afterwards (CI, a
temporary folder rotated away) prints this with its failure, so that one failure is enough
to start from. `harel-beanie check-history --story EVENT` prints the same.

Free of I/O: it reads the records `harel_beanie.history.records.read_history` returns.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from harel_beanie.core.arguments import BadArgumentType, require_int, require_str
from harel_beanie.history.verdict import Verdict

#: the record fields every line shows in its own columns, not among the details
_COLUMNS = ("t", "p", "i", "type", "f")
#: the anomaly kinds that name one event, and how their detail names it
_NAMES_AN_EVENT = ("lost", "doubled", "phantom", "reordered")
_EVENT = re.compile(r"event '([^']+)'")


def story(records: Iterable[Mapping[str, Any]], event_id: str) -> list[str]:
    """The lines of the story of the event `event_id`: each record whose `event` it is (its
    sends, publishes and deliveries, and their completions, paired by process and index), the
    faults' `on` and `off` notes, and the final record of the execution it was sent to.
    Seconds are counted from the history's first record."""
    event = require_str("event_id", event_id)
    rows = list(records)
    if not rows:
        return []
    t0 = min(int(r["t"]) for r in rows)
    mine = {(r["p"], r.get("i")) for r in rows if r.get("event") == event and r.get("type") == "invoke"}
    exes = {r.get("exe") or r.get("group") for r in rows if r.get("event") == event}
    lines = []
    for r in sorted(rows, key=lambda r: int(r["t"])):
        ours = r.get("event") == event or (r.get("type") != "info" and (r["p"], r.get("i")) in mine)
        fault = r.get("type") == "info" and r.get("f") == "fault"
        final = r.get("f") == "final" and r.get("exe") in exes
        if ours or fault or final:
            lines.append(_line(r, t0))
    return lines


def stories(records: Iterable[Mapping[str, Any]], verdict: Verdict, most: int = 3) -> str:
    """The stories of the first `most` events the verdict's anomalies name, as one text."""
    if not isinstance(verdict, Verdict):
        raise BadArgumentType("verdict", "the Verdict check() returned", verdict)
    most = require_int("most", most, low=0, high=100)
    rows = list(records)
    events: list[str] = []
    for anomaly in verdict.anomalies:
        found = _EVENT.search(anomaly.detail) if anomaly.kind in _NAMES_AN_EVENT else None
        if found and found.group(1) not in events:
            events.append(found.group(1))
    return "\n".join(
        f"the story of event {e!r} (seconds from the first record):\n  " + "\n  ".join(story(rows, e))
        for e in events[:most]
    )


def _line(r: Mapping[str, Any], t0: int) -> str:
    details = " ".join(f"{k}={_short(v)}" for k, v in r.items() if k not in _COLUMNS)
    return f"{(int(r['t']) - t0) / 1e9:9.3f}s {r['p']:<10} {r.get('f', '')} {r['type']} {details}".rstrip()


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 120 else text[:117] + "..."
