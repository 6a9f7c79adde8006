"""What the recording workers (`tests.support.netfaults.owned_worker`) say they did under
their partition leases, read back and judged.

Why it exists. Rule 3 of `harel_beanie.transport.ownership` promises that, with the
workers' clocks within `MARGIN` of each other, two workers never both act on one partition:
each acts only while its lease, by its own clock, has `MARGIN` left, and another takes the
partition only once the lease has ended by the taker's clock. This module turns the records
into the terms of that promise, on one time line (this machine's clock, `true`):

- a *fenced interval* per worker, partition and epoch: from the end of the look that gave
  the worker the lease until the earliest of the lease's end by the worker's clock (the
  last `until` it held, less `MARGIN` already, converted by the worker's skew), the look
  that found it taken over, and the give-back (above the fair share, or a clean stop);
- the *acts*: each claim that came back with a group of the partition, and each decision
  of a sweep or a claim to read it.

`overlaps` lists the pairs of fenced intervals of two workers on one partition that
intersect (both held a valid lease by their own clocks at once); `stray` lists the acts
outside their own fenced interval or inside another worker's on the same partition. Both
empty is the rule kept.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

#: the ways a lease ends before its clock says so (the records' `drop`)
ENDS = ("given back", "refused at renewal", "released")


@dataclass(frozen=True)
class Fenced:
    """One worker's lease on one partition under one epoch, on the machine's time line."""

    worker: str
    part: int
    epoch: int
    start: float
    end: float
    ended: str  # "clock", or one of ENDS


@dataclass(frozen=True)
class Act:
    worker: str
    part: int
    epoch: int
    true: float
    what: str
    own: float = 0.0  # the worker's clock when it acted
    until: Optional[float] = None  # the end of the lease it believed it held, by that clock


def read_records(directory: Path) -> list[dict[str, Any]]:
    """Every record of every worker incarnation (one file each); a line cut short by a
    SIGKILL is skipped."""
    out: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def skews(records: Iterable[dict[str, Any]]) -> dict[str, float]:
    return {r["w"]: float(r["skew"]) for r in records if r["k"] == "start"}


def fenced(records: list[dict[str, Any]]) -> list[Fenced]:
    """The fenced intervals the records show (see the module's docstring)."""
    skew = skews(records)
    start: dict[tuple[str, int, int], float] = {}
    until: dict[tuple[str, int, int], float] = {}
    ends: dict[tuple[str, int, int], tuple[float, str]] = {}
    for r in sorted(records, key=lambda r: r["true"]):
        if r["k"] == "lease":
            key = (r["w"], r["p"], r["ep"])
            start.setdefault(key, r["true"])
            until[key] = float(r["until"]) - skew.get(r["w"], 0.0)
        elif r["k"] == "drop" and r.get("ep") is not None:
            key = (r["w"], r["p"], r["ep"])
            if key in start and key not in ends:
                ends[key] = (r["true"], r["why"])
    out = []
    for key, began in start.items():
        end, how = until[key], "clock"
        if key in ends and ends[key][0] < end:
            end, how = ends[key]
        out.append(Fenced(*key, start=began, end=end, ended=how))
    return sorted(out, key=lambda f: (f.part, f.start))


def acts(records: list[dict[str, Any]]) -> list[Act]:
    return [
        Act(r["w"], lease[0], lease[1], r["true"], r["what"], r["t"], lease[3] if len(lease) > 3 else None)
        for r in records
        if r["k"] == "act"
        for lease in r["parts"]  # [partition, epoch, start, end] (the lease by its clock)
        if lease[0] is not None and lease[1] is not None
    ]


def overlaps(intervals: list[Fenced]) -> list[tuple[Fenced, Fenced]]:
    """Pairs of fenced intervals of two workers on one partition that intersect."""
    by_part: dict[int, list[Fenced]] = defaultdict(list)
    for f in intervals:
        by_part[f.part].append(f)
    out = []
    for fs in by_part.values():
        for i, a in enumerate(fs):
            for b in fs[i + 1 :]:
                if a.worker != b.worker and a.start < b.end and b.start < a.end:
                    out.append((a, b))
    return out


def successions(intervals: list[Fenced]) -> list[tuple[Fenced, Fenced]]:
    """Each fenced interval with the next one of another worker on its partition."""
    by_part: dict[int, list[Fenced]] = defaultdict(list)
    for f in intervals:
        by_part[f.part].append(f)
    out = []
    for fs in by_part.values():
        fs.sort(key=lambda f: f.start)
        out += [(a, b) for a, b in zip(fs, fs[1:]) if a.worker != b.worker]
    return out


def stray(intervals: list[Fenced], done: list[Act]) -> list[tuple[Act, str]]:
    """Acts past the lease they believed they held by their own clock, outside their own
    fenced interval, or inside another worker's on the partition."""
    own = {(f.worker, f.part, f.epoch): f for f in intervals}
    by_part: dict[int, list[Fenced]] = defaultdict(list)
    for f in intervals:
        by_part[f.part].append(f)
    out = []
    for a in done:
        if a.until is not None and not a.own < a.until:
            out.append((a, "past its lease by its own clock"))
        mine = own.get((a.worker, a.part, a.epoch))
        if mine is None or not mine.start <= a.true < mine.end:
            out.append((a, f"outside its own lease {mine}"))
            continue
        for f in by_part[a.part]:
            if f.worker != a.worker and f.start <= a.true < f.end:
                out.append((a, f"inside {f.worker}'s lease {f}"))
    return out


def refused(records: list[dict[str, Any]], worker: str, why: str, after: float) -> dict[int, int]:
    """Partition -> epoch of the leases `worker` was refused (`drop` with `why`, or a claim or
    sweep's `refused` with `why`) after `after` on the machine's clock."""
    out: dict[int, int] = {}
    for r in records:
        if r["w"] != worker or r["true"] < after or r.get("why") != why:
            continue
        if r["k"] == "drop":
            out[r["p"]] = r["ep"]
        elif r["k"] == "refused":
            out.update({p: ep for p, ep, *_ in r["parts"] if p is not None})
    return out


def summary(pairs: list[tuple[Fenced, Fenced]], limit: int = 5) -> str:
    return "\n".join(
        f"partition {a.part}: {a.worker} epoch {a.epoch} [{a.start:.3f}, {a.end:.3f}) ({a.ended}) and "
        f"{b.worker} epoch {b.epoch} [{b.start:.3f}, {b.end:.3f}) ({b.ended})"
        for a, b in pairs[:limit]
    )
