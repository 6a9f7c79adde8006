"""What one event costs the server, by kind of work: the table `make bench` and
`make bench-partitions` print for each stack and concurrency, with the floor beside it.

An event's cost is everything sent to bring it from its publish to its ack, split in two parts
as the benchmark runs them: the worker's (claim, load, commit, ack, and what the worker does
around them: the relay, the timer sweep, the counts' fold, the minute samples, the partition
leases) and the producer's (creating the executions and sending their events: the publishes,
and the loads harel's runner sends with them). Commands per event are counted on the wire, by
kind (bench/common/kinds.py). Server CPU per event is the server process's CPU over the part
(read from /proc), divided among the kinds in proportion to each kind's time on the wire in that
part, as the clients timed it (sent until answered): see bench/RESULTS.md ("What one event
costs") for what that attribution can and cannot say.

The floor is the least an event can cost: one commit (its execution's update) and one publish
(the message that carried it), two commands, at the CPU this stack's own commits and publishes
took each.

Nothing here talks to a server or times anything: the measurements fill `Part`s, this module
adds them up and writes the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from bench.common.kinds import ALL, EXTRA, KINDS

PARTS = ("worker", "producer")


@dataclass
class Part:
    """What one part (worker or producer) sent while timed: commands and wire seconds by kind,
    and the server's CPU seconds meanwhile (None where unreadable, or read for the whole)."""

    counts: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    server_cpu: Optional[float] = None

    def add(self, counts: dict[str, int], seconds: dict[str, float], server_cpu: Optional[float]) -> None:
        for kind, n in counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + n
        for kind, s in seconds.items():
            self.seconds[kind] = self.seconds.get(kind, 0.0) + s
        if server_cpu is not None:
            self.server_cpu = (self.server_cpu or 0.0) + server_cpu


@dataclass
class Cost:
    """One stack at one concurrency: its parts over `events` handled events. `server_cpu` is the
    server's CPU over both parts together, where it could not be read for each apart (the
    producer and the worker processes running at once): then the kinds share it by their wire
    time over both parts."""

    events: int = 0
    parts: dict[str, Part] = field(default_factory=lambda: {p: Part() for p in PARTS})
    server_cpu: Optional[float] = None

    def commands(self, kind: str, part: Optional[str] = None) -> float:
        """Commands of `kind` per event, in `part` or in both."""
        if not self.events:
            return 0.0
        parts = [self.parts[part]] if part else list(self.parts.values())
        return sum(p.counts.get(kind, 0) for p in parts) / self.events

    def cpu_ms(self, kind: str) -> Optional[float]:
        """The server's CPU ms per event attributed to `kind`, or None if not measured."""
        if not self.events:
            return None
        if self.server_cpu is not None:
            wire = sum(sum(p.seconds.values()) for p in self.parts.values())
            mine = sum(p.seconds.get(kind, 0.0) for p in self.parts.values())
            return None if wire <= 0 else 1000 * self.server_cpu * mine / wire / self.events
        total = 0.0
        for p in self.parts.values():
            wire = sum(p.seconds.values())
            if p.server_cpu is None:
                if p.counts:
                    return None  # a part that sent commands but whose CPU is unknown
                continue
            total += 0.0 if wire <= 0 else p.server_cpu * p.seconds.get(kind, 0.0) / wire
        return 1000 * total / self.events

    def total_cpu_ms(self) -> Optional[float]:
        if not self.events:
            return None
        if self.server_cpu is not None:
            return 1000 * self.server_cpu / self.events
        if any(p.server_cpu is None and p.counts for p in self.parts.values()):
            return None
        return 1000 * sum(p.server_cpu or 0.0 for p in self.parts.values()) / self.events

    def per_command_ms(self, kind: str) -> Optional[float]:
        """The server's CPU ms one command of `kind` took on average here."""
        ms, n = self.cpu_ms(kind), self.commands(kind)
        return None if ms is None or n <= 0 else ms / n

    def floor_ms(self) -> Optional[float]:
        """The floor's server CPU ms per event: one commit and one publish, at this stack's own
        CPU per commit and per publish command."""
        commit, publish = self.per_command_ms("commit"), self.per_command_ms("publish")
        return None if commit is None or publish is None else commit + publish


def between(
    events: int, server_cpu: Optional[float], before: dict[str, Any], after: dict[str, Any], producer: Any
) -> Cost:
    """The cost of `events` when the workers are processes of their own: their commands between
    two readings of their tallies (bench/common/tally_child.py), the producer's as this process
    counted them (a `Wire`: its kinds and their wire seconds), and the server's CPU read once
    over both."""
    cost = Cost(events=events, server_cpu=server_cpu)
    worker = cost.parts["worker"]
    for kind, n in after["counts"].items():
        worker.counts[kind] = n - before["counts"].get(kind, 0)
    for kind, s in after["seconds"].items():
        worker.seconds[kind] = s - before["seconds"].get(kind, 0.0)
    cost.parts["producer"].add(producer.kinds, producer.kind_seconds, None)
    return cost


def _f(x: Optional[float], digits: int = 2) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:,.{digits}f}"


def table(costs: list[tuple[str, Cost]]) -> list[str]:
    """The markdown table for stacks at one concurrency: a row per kind of work (the kinds
    outside the stack's work only where some were sent), the total, and the floor; for each
    stack its commands per event (worker, producer), server CPU ms per event and that
    kind's share of it."""
    head = "| kind of work | " + " | ".join(
        f"{label}: commands per event, worker | producer | server CPU ms per event | share" for label, _ in costs
    )
    out = [head + " |", "|---|" + "---:|---:|---:|---:|" * len(costs)]
    shown = list(KINDS) + [k for k in EXTRA if any(c.commands(k) for _, c in costs)]
    for kind in shown:
        cells = []
        for _, c in costs:
            ms, total = c.cpu_ms(kind), c.total_cpu_ms()
            share = None if ms is None or not total else 100 * ms / total
            cells += [_f(c.commands(kind, "worker")), _f(c.commands(kind, "producer")), _f(ms), _f(share, 0) + "%"]
        out.append(f"| {kind} | " + " | ".join(cells) + " |")
    total_cells = []
    floor_cells = []
    for _, c in costs:
        worker = sum(c.commands(k, "worker") for k in ALL)
        producer = sum(c.commands(k, "producer") for k in ALL)
        total_cells += [_f(worker), _f(producer), _f(c.total_cpu_ms()), "100%"]
        ms, total = c.floor_ms(), c.total_cpu_ms()
        floor_cells += ["1.00", "1.00", _f(ms), ("-" if ms is None or not total else f"{100 * ms / total:.0f}") + "%"]
    out.append("| **all** | " + " | ".join(total_cells) + " |")
    out.append("| *floor: one commit, one publish* | " + " | ".join(floor_cells) + " |")
    return out
