"""Scale-out figures for partitions, in one run (`make bench-partitions`):

    python -m bench.partitions.run            # full sizes; writes its section of bench/RESULTS.md
    python -m bench.partitions.run --stored 200 --backlog 100 --queued 100 --workers 1 --kills 0 --out X.md

1. Work per background operation (bench/partitions/work.py): a claim, a post-commit relay read
   of one family, a timer sweep and a relay sweep, owning 1 of 16 partitions, all 16, and
   without partition filtering (how main read before partitions), on a database of finished
   executions with no other pending work and with a backlog of pending entries and queued
   messages: the documents each selects and its median time.
2. Events/s with 1, 2 and 4 worker processes on each stack (bench/partitions/workers.py).
3. Seconds from a worker's SIGKILL until its partitions are owned by the survivor and their
   queued work is claimed again, with 2 workers, beside the stated bound.

It runs on the embedded server (SecantusDB, a child process) and, when MONGODB_URL is set
(or --url given), on that server too. The machine is shared: only ratios within one run
mean anything. The section goes between its markers in the output file; the rest of the
file (bench/store/run.py's report) is kept.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from bench.common.cost import table
from bench.common.harness import HERE, load_definitions, machine, server_info
from bench.common.sections import splice
from bench.partitions.reading import rate_of, ratio, reading
from bench.partitions.work import ENTRIES, OP_LABEL, OPS, SCOPE_LABEL, SCOPES, Sizes, WorkCell, cell, run_work
from bench.partitions.workers import CONCURRENCY, STACK_LABEL, STACKS, Rate, Takeover, events_per_second, takeover
from harel_beanie.core.partitions import DEFAULT_PARTITIONS
from harel_beanie.deploy.embedded import EmbeddedServer
from harel_beanie.transport.ownership import TAKEOVER_BOUND

SECTION = "partitions"
FULL = Sizes()


@dataclass
class Options:
    sizes: Sizes
    workers: list[int]
    executions: int
    budget: float
    kills: int
    stacks: list[str]


@dataclass
class ServerFigures:
    name: str
    info: dict[str, str]
    work: list[WorkCell] = field(default_factory=list)
    seeding: dict[str, float] = field(default_factory=dict)
    rates: list[Rate] = field(default_factory=list)
    takeovers: list[Takeover] = field(default_factory=list)
    load: list[tuple[float, float, float]] = field(default_factory=list)
    fresh: bool = False  # the worker processes ran on a fresh server of the same kind, the first stopped


def run_server(name: str, url: str, opts: Options) -> ServerFigures:
    """The first part: work per operation."""
    say = lambda msg: print(f"[{name}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    figs = ServerFigures(name, server_info(name, url))
    figs.load.append(os.getloadavg())
    figs.work, figs.seeding = run_work(url, load_definitions(), opts.sizes, say)
    return figs


def run_workers(figs: ServerFigures, url: str, opts: Options, fresh: bool, server_pid: Optional[int] = None) -> None:
    say = lambda msg: print(f"[{figs.name}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    figs.fresh = fresh
    for i, n in enumerate(opts.workers):
        order = opts.stacks if i % 2 == 0 else list(reversed(opts.stacks))  # the machine drifts
        for stack in order:
            figs.rates.append(events_per_second(stack, n, url, opts.executions, opts.budget, say, server_pid))
    for _ in range(opts.kills):
        figs.takeovers.append(takeover(url, say))
    figs.load.append(os.getloadavg())


# --- the report ------------------------------------------------------------------------------


def _f(x: Optional[float], digits: int = 1) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:,.{digits}f}"


def work_table(figs: ServerFigures) -> list[str]:
    out = [
        "| operation | partitions | selected: no other work | selected: backlog | ms: no other work | ms: backlog "
        "| ms: backlog / no other work | ms at backlog vs before | round trips |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for op in OPS:
        before = cell(figs.work, "backlog", "none", op)
        for scope in SCOPES:
            e, b = cell(figs.work, "empty", scope, op), cell(figs.work, "backlog", scope, op)
            if e is None or b is None:
                continue
            versus = "" if scope == "none" or before is None else ratio(b.ms, before.ms)
            out.append(
                f"| {OP_LABEL[op]} | {SCOPE_LABEL[scope]} | {e.selected:,} | {b.selected:,} | {e.ms:.2f} | "
                f"{b.ms:.2f} | {ratio(b.ms, e.ms)} | {versus} | {b.commands:.0f} |"
            )
    return out


def rate_table(figs: ServerFigures, opts: Options) -> list[str]:
    stacks = [s for s in STACKS if any(r.stack == s for r in figs.rates)]
    head = " | ".join(f"{STACK_LABEL[s]}" for s in stacks)
    ratios = [s for s in stacks if s != "beanie"] if "beanie" in stacks else []
    out = [
        f"| workers | {head} | " + " | ".join(f"partitions / {s}" for s in ratios) + " |",
        "|---:|" + "---:|" * (len(stacks) + len(ratios)),
    ]

    def rate(stack: str, n: int) -> Optional[Rate]:
        return rate_of(figs, stack, n)

    for n in opts.workers:
        cells = []
        for s in stacks:
            r, one = rate(s, n), rate(s, opts.workers[0])
            if r is None:
                cells.append("-")
                continue
            scale = (
                f" ({ratio(r.rate, one.rate if one else None)} of {opts.workers[0]})" if n != opts.workers[0] else ""
            )
            if r.seconds == 0:
                cells.append("failed (warm-up not drained)")
                continue
            cells.append(f"{r.rate:.1f}{scale}" + ("" if r.drained else " (not drained)"))
        beanie = rate("beanie", n)
        ratio_cells = [
            ratio(beanie.rate if beanie else None, (rate(s, n) or Rate(s, n, 0, 0, 0.0, False)).rate) for s in ratios
        ]
        out.append(f"| {n} | " + " | ".join(cells + ratio_cells) + " |")
    return out


def server_cpu_table(figs: ServerFigures, opts: Options) -> list[str]:
    """The server's CPU per event and how busy it was, each stack and worker count (embedded
    server only: its process is on this machine)."""
    stacks = [s for s in STACKS if any(r.stack == s and r.server_cpu is not None for r in figs.rates)]
    if not stacks:
        return []
    out = [
        "The server's CPU while each ran: ms per event, and its share of one CPU over the run (the embedded "
        "server is one Python process).",
        "",
        "| workers | " + " | ".join(STACK_LABEL[s] for s in stacks) + " |",
        "|---:|" + "---:|" * len(stacks),
    ]
    for n in opts.workers:
        cells = []
        for s in stacks:
            r = rate_of(figs, s, n)
            per_event, busy = (r.server_ms_per_event, r.server_busy) if r else (None, None)
            cells.append("-" if per_event is None or busy is None else f"{per_event:.1f} ms, {busy:.0%}")
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return out


def cost_tables(figs: ServerFigures, opts: Options) -> list[str]:
    """What one event cost each stack, by kind of work, a table per worker count (none where
    the rates carry no costs, as in a report rendered from figures kept before)."""
    if not any(r.cost for r in figs.rates):
        return []
    out = ["", "#### What one event costs, by kind of work", ""]
    out.append(
        "Commands per event on the wire: *worker*, what the worker processes sent during the drive (each "
        "counts its own, bench/common/tally_child.py); *producer*, this process's creates and sends, and its "
        "polls for DONE as *observer*. The server's CPU over the drive, shared among the kinds by their wire "
        'time over both parts (bench/common/cost.py; how, and what that cannot say: the section "What one '
        'event costs, by kind of work" of this file). '
        "*floor*: one commit and one publish, at the CPU this stack's own took."
    )
    for n in opts.workers:
        costs = [(STACK_LABEL[r.stack], r.cost) for s in STACKS if (r := rate_of(figs, s, n)) and r.cost]
        if costs:
            out += ["", f"{n} worker process{'es' if n > 1 else ''}:", ""] + table(costs)
    return out


def takeover_table(figs: ServerFigures) -> list[str]:
    out = [
        "| repetition | partitions lost | lease left at the kill (s) | all owned again after (s) "
        "| first queued message claimed after (s) | all claimed after (s) | epochs bumped | bound (s) |",
        "|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for i, t in enumerate(figs.takeovers, 1):
        out.append(
            f"| {i} | {t.lost} | {t.lease_left:.1f} | {_f(t.owned)} | {_f(t.first_claim)} | {_f(t.all_claimed)} "
            f"| {'yes' if t.epochs_bumped else 'NO'} | {TAKEOVER_BOUND:g} |"
        )
    return out


def report(runs: list[ServerFigures], opts: Options, started: datetime.datetime, seconds: float, argv: str) -> str:
    """The section: the run and its sizes, then each server's tables and the reading of them."""
    m = machine()
    s = opts.sizes
    out = [
        "## Partitions: work per operation, events/s per worker count, takeover",
        "",
        f"Run {started:%Y-%m-%d %H:%M} UTC with `python -m bench.partitions.run{argv}` in {seconds / 60:.1f} min.",
        f"Machine: {m['cpus']} CPUs, {m['cpu']}; {m['os']}; Python {m['python']}; harel {m['harel']}, "
        f"pymongo {m['pymongo']}, motor {m['motor']}, beanie {m['beanie']}.",
        f"Sizes: {s.stored:,} stored (finished) executions; backlog {s.backlog:,} pending outbox entries over "
        f"{max(1, s.backlog // ENTRIES):,} other executions (each with a timer, half of them due) and {s.queued:,} "
        f"queued messages over as many groups; {DEFAULT_PARTITIONS} partitions; median of up to {s.reps} "
        f"operations each; {opts.executions} Parcels ({opts.executions * 5:,} events) per worker "
        f"configuration, concurrency {CONCURRENCY} per worker process; {opts.kills} kill(s)."
        + (
            " Reduced from the full sizes."
            if (s.stored, s.backlog, s.queued) != (FULL.stored, FULL.backlog, FULL.queued)
            else ""
        ),
    ]
    for figs in runs:
        out += _server_section(figs, opts)
    return "\n".join(out) + "\n"


def _server_section(figs: ServerFigures, opts: Options) -> list[str]:
    """One server: what it reports, the work per operation, worker counts, takeovers, the reading."""
    info = figs.info
    out = ["", f"### {info['server']}", ""]
    out.append(
        f"Reports itself as {info['reports']}, {info['topology']}. Load average (1/5/15 min) "
        + " at the start, ".join("/".join(f"{x:.2f}" for x in la) for la in figs.load)
        + " at the end. Seeding took "
        + ", ".join(f"{k} {v:.1f} s" for k, v in figs.seeding.items())
        + " (clones of documents the store wrote, by insert_many)."
    )
    out += ["", "#### Work per operation", ""]
    out.append(
        "*selected*: the documents the operation's filters select, counted by `count_documents` on the "
        "filters it sent: what mongod's index scan examines (this server's `explain` is synthesised). "
        "*before*: a store and transport without partition filtering (`PartitionScope(held=None)`), the "
        "relay read as main made it then (`pending_spawns()` over every pending document). *ms*: median "
        "per operation; the relay read is `pending_spawns(within=x)` then `pending_outbox(within=x)`."
    )
    out += [""] + work_table(figs)
    if figs.rates:
        out += ["", "#### Events/s per number of worker processes", ""]
        out.append(
            "From the first publish until every Parcel is DONE; in brackets the rate against the same "
            "stack's with one worker; the last columns: partitions' stack over the others. A fresh database "
            "per configuration"
            + (
                ", on a second embedded server started for the worker runs once the first was stopped."
                if figs.fresh
                else "."
            )
        )
        out += [""] + rate_table(figs, opts)
        cpu = server_cpu_table(figs, opts)
        out += [""] + cpu if cpu else []
        out += cost_tables(figs, opts)
    if figs.takeovers:
        out += ["", "#### Takeover after a SIGKILL (2 workers)", ""]
        out.append(
            "Seconds from the SIGKILL until the survivor owned every partition the dead worker held (the "
            f"`{'<prefix>'}_hb_partitions` collection, polled every 50 ms), and until the message published "
            "to an execution in each of them was claimed (the queue collection). The bound is "
            "`TAKEOVER_BOUND` in transport/ownership.py."
        )
        out += [""] + takeover_table(figs)
    out += ["", "#### What they show", "", reading(figs, opts)]
    return out


# --- the command -----------------------------------------------------------------------------


def parse_args(argv: Optional[list[str]] = None) -> tuple[Options, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stored", type=int, default=FULL.stored, help="finished executions (default 20000)")
    p.add_argument("--backlog", type=int, default=FULL.backlog, help="pending outbox entries (default 10000)")
    p.add_argument("--queued", type=int, default=FULL.queued, help="queued messages, one a group (default 10000)")
    p.add_argument("--reps", type=int, default=FULL.reps, help="timed operations per cell (default 15)")
    p.add_argument("--workers", default="1,2,4", help="worker process counts (default 1,2,4)")
    p.add_argument("--executions", type=int, default=150, help="Parcels per worker configuration (default 150)")
    p.add_argument(
        "--budget",
        type=float,
        default=120.0,
        help="seconds a worker configuration may take to drain (default 120; a limit, not a figure)",
    )
    p.add_argument("--kills", type=int, default=3, help="takeover repetitions (default 3; 0 skips)")
    p.add_argument("--stacks", default=",".join(STACKS), help=f"worker stacks (default {','.join(STACKS)})")
    p.add_argument("--url", default=os.environ.get("MONGODB_URL"), help="also run on this server ($MONGODB_URL)")
    p.add_argument("--no-embedded", action="store_true", help="skip the embedded server (needs --url)")
    p.add_argument("--out", default=str(HERE / "RESULTS.md"), help="the file the section goes in")
    a = p.parse_args(argv)
    sizes = Sizes(stored=a.stored, backlog=a.backlog, queued=a.queued, reps=a.reps)
    stacks = [s for s in a.stacks.split(",") if s]
    if not set(stacks) <= set(STACKS):
        p.error(f"--stacks: one of {', '.join(STACKS)}")
    workers = [int(n) for n in a.workers.split(",") if n] if a.workers else []
    return Options(sizes, workers, a.executions, a.budget, a.kills, stacks), a


def main(argv: Optional[list[str]] = None) -> int:
    opts, a = parse_args(argv)
    if a.no_embedded and not a.url:
        print("--no-embedded needs --url or MONGODB_URL", file=sys.stderr)
        return 2
    started = datetime.datetime.now(datetime.timezone.utc)
    t = time.perf_counter()
    runs = []
    if not a.no_embedded:
        with EmbeddedServer() as server:
            runs.append(run_server("embedded", server.url, opts))
        # the worker processes on a fresh embedded server, the first one stopped: it spends
        # seconds of CPU on the large database the first part dropped
        with EmbeddedServer() as fresh:
            run_workers(runs[-1], fresh.url, opts, fresh=True, server_pid=fresh.proc.pid if fresh.proc else None)
    if a.url:
        runs.append(run_server("url", a.url, opts))
        run_workers(runs[-1], a.url, opts, fresh=False)
    shown = " ".join(sys.argv[1:] if argv is None else argv)
    text = report(runs, opts, started.replace(tzinfo=None), time.perf_counter() - t, f" {shown}" if shown else "")
    print(text)
    splice(Path(a.out), SECTION, text)
    print(f"written to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
