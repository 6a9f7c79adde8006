"""What the partitions' figures show, said in the run's own numbers: the paragraph under the
tables of bench/RESULTS.md's partitions section.

Why this module exists: the reading is most of the report's text and changes on its own (a
new figure, a finding worth stating); `bench.partitions.run` measures and lays out the tables.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Optional

from bench.partitions.work import SCOPES, WorkCell, cell
from bench.partitions.workers import Rate
from harel_beanie.core.partitions import DEFAULT_PARTITIONS
from harel_beanie.transport.ownership import LEASE_SECONDS, RENEW_EVERY, TAKEOVER_BOUND

if TYPE_CHECKING:
    from bench.partitions.run import Options, ServerFigures


def ratio(a: Optional[float], b: Optional[float]) -> str:
    """`a` over `b` as "1.23x", or "-" when either is missing."""
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def rate_of(figs: ServerFigures, stack: str, n: int) -> Optional[Rate]:
    """The rate of `stack` with `n` worker processes, if measured."""
    return next((r for r in figs.rates if (r.stack, r.workers) == (stack, n)), None)


def reading(figs: ServerFigures, opts: Options) -> str:
    """What the figures show, in this run's own numbers."""
    parts = [_selected(figs), _times(figs)]
    parts += _scaling(figs, opts)
    stalled = [r for r in figs.rates if not r.drained and r.seconds > 0]  # a failed warm-up says so itself
    if stalled:
        parts.append(
            f"{len(stalled)} configuration(s) did not drain within {opts.budget:g} s (marked): their figure counts "
            "only the Parcels finished by then, and their ratios compare nothing."
        )
    parts += _takeover_reading(figs)
    return " ".join(parts)


def _work(figs: ServerFigures, state: str, scope: str, op: str) -> WorkCell:
    found = cell(figs.work, state, scope, op)
    assert found is not None
    return found


def _selected(figs: ServerFigures) -> str:
    """What each operation selects with a backlog, owning one partition, all, or none."""
    relay, sweep, timer = (
        {s: _work(figs, "backlog", s, op) for s in SCOPES} for op in ("relay read", "relay sweep", "timer sweep")
    )
    return (
        f"With a backlog the post-commit relay read selects {relay['one'].selected:,} document(s) (its own family) "
        f"where main before partitions selected {relay['none'].selected:,} (every pending document): flat in the "
        f"backlog ({_work(figs, 'empty', 'one', 'relay read').selected:,} without it). The sweeps "
        f"select what the partitions owned hold: owning 1 of {DEFAULT_PARTITIONS}, the relay sweep "
        f"{sweep['one'].selected:,} and the timer sweep {timer['one'].selected:,}, against "
        f"{sweep['all'].selected:,} and {timer['all'].selected:,} owning all of them (the same as without "
        "partitions): they grow with the owned share of the backlog, so N workers divide it. On mongod those "
        "counts are the index keys examined."
    )


def _times(figs: ServerFigures) -> str:
    """The relay read's and the claim's times with a backlog, and why this server's differ from mongod's."""
    relay = {s: _work(figs, "backlog", s, "relay read") for s in SCOPES}
    claim = {s: _work(figs, "backlog", s, "claim") for s in SCOPES}
    return (
        f"The times are this server's: the relay read took {relay['one'].ms:.1f} ms against "
        f"{relay['none'].ms:.1f} ms before ({ratio(relay['one'].ms, relay['none'].ms)}), a claim owning one "
        f"partition {claim['one'].ms:.1f} ms, owning all {claim['all'].ms:.1f} ms, without partitions "
        f"{claim['none'].ms:.1f} ms. A claim reads windows of its key from `hb_claim`, which SecantusDB serves "
        "only for a filter of exactly the key's range and the index's partial filter (transport/queues.py, "
        "Rule 3): on an unsharded collection the window names no partition, so a worker owning 1 of "
        f"{DEFAULT_PARTITIONS} reads every partition's groups in it and keeps its own. A claim's *selected* "
        "count is its warm-up's: the first claim of a process reads every due group once. The partial indexes' "
        "upkeep grows with the pending documents (the family read, one `_id` range with `part`, still pays for "
        "that); mongod's cost follows the counts. (SecantusDB plans any filter holding `$or` as a collection "
        "scan, which is why the family read is one `_id` range: written as an `$or` of the id and its "
        "descendants' range it took 0.8-1.3 s here.)"
    )


def _scaling(figs: ServerFigures, opts: Options) -> list[str]:
    """How events/s changed from the fewest worker processes to the most, each stack."""
    if not figs.rates or len(opts.workers) <= 1:
        return []
    lo, hi = opts.workers[0], opts.workers[-1]
    scale = []
    for s in opts.stacks:
        a, b = rate_of(figs, s, lo), rate_of(figs, s, hi)
        if a and b:
            scale.append(f"{s} {ratio(b.rate, a.rate)}")
    return [
        f"From {lo} to {hi} worker processes events/s changed by " + ", ".join(scale) + f". The {os.cpu_count()} "
        "CPUs are shared by the server (one Python process), the workers, the publisher and the machine's "
        "other work (the load averages above), so more workers add no CPU here and these rates say little "
        "about scaling; compare the stacks within a row."
    ] + _server_bound(figs, opts)


def _server_bound(figs: ServerFigures, opts: Options) -> list[str]:
    """Whether the partitions' stack ran out of server: its busiest share of one CPU."""
    ours = [r for r in figs.rates if r.stack == "beanie"]
    busy = {r.workers: r.server_busy for r in ours if r.server_busy is not None}
    per_event = {r.workers: r.server_ms_per_event for r in ours if r.server_ms_per_event is not None}
    if not busy:
        return []
    shares = ", ".join(f"{busy[n]:.0%} at {n}" for n in opts.workers if n in busy)
    costs = ", ".join(f"{per_event[n]:.1f} ms at {n}" for n in opts.workers if n in per_event)
    return [
        f"The server's share of one CPU while the partitions' stack ran: {shares}; its CPU per event: {costs}. "
        "A server near one whole CPU is the bound on that stack's rate, whatever the number of workers."
    ]


def _takeover_reading(figs: ServerFigures) -> list[str]:
    """How long the survivor took to own a killed worker's partitions, against the bound."""
    done = [t for t in figs.takeovers if not math.isnan(t.owned)]
    if not done:
        return []
    late = [t.owned - t.lease_left for t in done]
    claimed = [t.all_claimed - t.owned for t in done if not math.isnan(t.all_claimed)]
    return [
        f"After a SIGKILL the survivor owned the dead worker's partitions after "
        f"{min(t.owned for t in done):.1f}-{max(t.owned for t in done):.1f} s (bound {TAKEOVER_BOUND:g} s: "
        f"a {LEASE_SECONDS:g} s lease plus a {RENEW_EVERY:g} s look): the lease left at the kill plus "
        f"{min(late):.1f}-{max(late):.1f} s until the survivor's next look"
        + (f"; their queued messages were all claimed {max(claimed):.1f} s after that at most." if claimed else ".")
    ]
