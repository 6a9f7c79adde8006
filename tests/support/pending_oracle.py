"""The pending figures from the documents themselves, computed apart from the code that shows
them: how many outbox entries and spawns are pending, how old the oldest of each kind is, and
which executions hold the oldest ones.

Why this module exists: `queries.backlog` (and through it `harel-beanie status`, `/backlog`,
its JSON and `/metrics`) reads these figures through partial indexes, an aggregation, the
per-minute sample (`queries.samples`) and the oldest-entries walk (`queries.oldest`). A test
that asked those modules for the truth would agree with itself. Here the definition is
written again from what docs/dashboard.md says, over raw documents (plain dicts from a
`find({})`): every entry of every execution's `outbox` and `spawns` counts, whatever its
`pending` flag says; an entry's age is the time since its seq's millisecond (the seq layout
the store's seqs module states: milliseconds since 2024-01-01 above the low 22 bits), with
no age for a seq harel's own counter handed out (below 2^40); an execution's place in the
oldest list is its smallest seq of that kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

#: 2024-01-01T00:00:00Z in ms, and the bits below a seq's millisecond (node and counter)
_EPOCH_MS = 1_704_067_200_000
_LOW_BITS = 22
_HARELS = 1 << 40
KINDS = {"outbox": "outbox", "spawn": "spawns"}


def born(seq: int) -> Optional[float]:
    """When a seq was minted (epoch seconds), or None for one from harel's own counter."""
    if seq < _HARELS:
        return None
    return ((seq >> _LOW_BITS) + _EPOCH_MS) / 1000.0


def age(seq: int, now: float) -> Optional[float]:
    at = born(seq)
    return None if at is None else max(0.0, now - at)


@dataclass
class PendingTruth:
    """What the documents hold: the entries of each kind, and per kind the holders as
    (smallest seq, execution id, definition, entries held), smallest first."""

    now: float
    counts: dict[str, int] = field(default_factory=dict)
    holders: dict[str, list[tuple[int, str, Optional[str], int]]] = field(default_factory=dict)

    def oldest_age(self, kind: str) -> Optional[float]:
        held = self.holders[kind]
        return age(held[0][0], self.now) if held else None

    def oldest_ids(self, kind: str, n: int) -> list[str]:
        return [eid for _, eid, _, _ in self.holders[kind][:n]]

    def at(self, now: float) -> "PendingTruth":
        """The same documents, looked at later (the ages grown)."""
        return PendingTruth(now, dict(self.counts), {k: list(v) for k, v in self.holders.items()})


def pending_truth(docs: Iterable[dict[str, Any]], now: float) -> PendingTruth:
    """The pending figures of these documents at `now` (see the module)."""
    out = PendingTruth(now, {kind: 0 for kind in KINDS}, {kind: [] for kind in KINDS})
    for d in docs:
        for kind, array in KINDS.items():
            seqs = [e["seq"] for e in d.get(array) or []]
            out.counts[kind] += len(seqs)
            if seqs:
                out.holders[kind].append((min(seqs), d["_id"], d.get("definition_id"), len(seqs)))
    for held in out.holders.values():
        held.sort()
    return out


def differences(said: Any, truth: PendingTruth, *, who: str, slack: float = 1e-6) -> list[str]:
    """Where a `Backlog` (or an object with its fields) differs from the truth: the counts
    and the oldest ages of each kind, the ages within `slack` seconds."""
    out = []
    for kind, (count, oldest) in {
        "outbox": ("pending_outbox", "oldest_outbox_age"),
        "spawn": ("pending_spawns", "oldest_spawn_age"),
    }.items():
        n, a = getattr(said, count), getattr(said, oldest)
        if n != truth.counts[kind]:
            out.append(f"{who}: {count} {n}, the documents hold {truth.counts[kind]}")
        want = truth.oldest_age(kind) if truth.counts[kind] else None
        if (a is None) != (want is None) or (a is not None and want is not None and abs(a - want) > slack):
            out.append(f"{who}: {oldest} {a}, the documents' oldest is {want}")
    return out
