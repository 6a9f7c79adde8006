"""The verdict on a history: the anomalies found, each of a named kind, and the figures.

Why this module exists: a verdict is read by people (the `check-history` command, a failing
test's message) and by scripts (`--json`, the reliability figures); what it holds and how
it reads is written here, apart from the rules that fill it (`harel_beanie.history.checker`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

#: every kind of anomaly the checker reports (its module docstring gives the rule of each)
KINDS = (
    "lost",
    "doubled",
    "phantom",
    "skipped-version",
    "same-version",
    "lost-ack",
    "unaccounted-version",
    "stale-read",
    "reordered",
    "replay-mismatch",
    "not-drained",
    "no-final",
)


@dataclass(frozen=True)
class Anomaly:
    kind: str  # one of KINDS
    exe: Optional[str]  # None: the run as a whole
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} {self.exe if self.exe is not None else '(run)'}: {self.detail}"

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "exe": self.exe, "detail": self.detail}


@dataclass
class Verdict:
    """Every anomaly found, and the figures of the history judged: `operations` (by
    operation, then outcome: ok, fail, unknown, incomplete), `operation_count`, `unknown`,
    `incomplete`, `stray_completions`, `processes`, `executions` (final records),
    `events_sent` (distinct ids per execution), `events_applied` (entries of the final
    `seen` lists), `replayed` and `replay_skipped` (root final states), `faults` (by kind),
    `publishes` and `deliveries` (transport records), `fifo_pairs` (ordered publishes whose
    deliveries were compared)."""

    anomalies: list[Anomaly] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def counts(self) -> dict[str, int]:
        return dict(Counter(a.kind for a in self.anomalies))

    def summary(self) -> str:
        f = self.figures
        found = "no anomaly" if self.ok else ", ".join(f"{n} {k}" for k, n in sorted(self.counts().items()))
        return (
            f"{'ok' if self.ok else 'FAILED'}: {found}; {f.get('operation_count', 0)} operations "
            f"({f.get('unknown', 0)} unknown, {f.get('incomplete', 0)} incomplete) on "
            f"{f.get('executions', 0)} executions; {f.get('events_sent', 0)} events sent, "
            f"{f.get('events_applied', 0)} applied; {f.get('replayed', 0)} final states replayed"
        )

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "anomalies": [a.as_dict() for a in self.anomalies], "figures": self.figures}
