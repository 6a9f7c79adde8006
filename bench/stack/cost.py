"""What one event costs each production stack, by kind of work (bench/common/cost.py): the
section `make bench` writes from its stack cells, and a small run of its own.

    python -m bench.stack.cost                       # both stacks at concurrency 1, 16 and 64
    python -m bench.stack.cost --events 20 --concurrency 1 --json
    python -m bench.stack.cost --out bench/RESULTS.md --note "..."

The run measures the stacks as `make bench` does (bench/store/throughput.py: harel's
`AsyncWorker` on each store and its own transport, waves of Parcels on an empty database, the
embedded server started here so its CPU can be read), and prints the tables; with `--json`, the
figures as JSON instead (what the smoke test reads); with `--out`, its section of that file
(between its markers, the rest kept), with how the CPU is shared among the kinds and the
limits of that.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import pymongo

from bench.common.cost import Cost, table
from bench.common.harness import LABEL, STACK_BASE_RUNNERS, STACKS, Cell, ServerRun, load_definitions, machine
from bench.common.kinds import ALL
from bench.common.sections import splice
from bench.common.wire import TALLY
from bench.store.throughput import measure
from harel_beanie.deploy.embedded import EmbeddedServer


def cost_of(cells: list[Cell]) -> Cost:
    """The cost of the events of `cells` (one stack, one runner, any rounds), summed over them:
    each cell's drain is the worker's part, its submitting the producer's."""
    cost = Cost()
    for c in cells:
        cost.events += c.events
        cost.parts["worker"].add(c.wire.kinds, c.wire.kind_seconds, c.wire.server_cpu)
        cost.parts["producer"].add(c.submit_wire.kinds, c.submit_wire.kind_seconds, c.submit_wire.server_cpu)
    return cost


def _stack_costs(run: ServerRun, runner: str, state: str = "empty") -> list[tuple[str, Cost]]:
    return [
        (LABEL[kind], cost_of([c for c in run.cells if (c.runner, c.state, c.store) == (runner, state, kind)]))
        for kind in STACKS
    ]


def cost_section(run: ServerRun) -> list[str]:
    """The report's section: a table per concurrency, untraced, on the empty database (none
    where the cells carry no kinds, as in a report rendered from figures kept before)."""
    if not any(c.wire.kinds for c in run.cells if c.store in STACKS):
        return []
    lines = ["", "### What one event costs, by kind of work", ""]
    lines.append(
        "Both stacks under harel's `AsyncWorker`, untraced, on the empty database, summed over the rounds. "
        "*worker*: commands per event handled while the worker drained a wave; *producer*: while the wave was "
        "created and its events sent. *server CPU*: the server process's CPU over each part, shared among the "
        "kinds by their time on the wire in that part (bench/common/cost.py; how, and what that cannot say: "
        'the section "What one event costs, by kind of work" of this file). *floor*: one commit and one publish, at the CPU this '
        "stack's own commit and publish commands took."
    )
    for runner in STACK_BASE_RUNNERS:
        costs = _stack_costs(run, runner)
        if not any(c.events for _, c in costs):
            continue
        lines += ["", f"{runner.replace('worker-', 'Concurrency ')}:", ""]
        lines += table(costs)
    return lines


# --- a run of its own ---------------------------------------------------------------------------


def figures(costs: dict[str, Cost]) -> dict[str, Any]:
    """The costs as plain numbers, by "stack concurrency": events, then per kind the worker's
    and the producer's commands per event and the CPU ms per event."""
    out: dict[str, Any] = {}
    for name, c in costs.items():
        out[name] = {
            "events": c.events,
            "total_cpu_ms": c.total_cpu_ms(),
            "floor_ms": c.floor_ms(),
            "kinds": {
                k: {"worker": c.commands(k, "worker"), "producer": c.commands(k, "producer"), "cpu_ms": c.cpu_ms(k)}
                for k in ALL
            },
        }
    return out


def run(url: str, concurrencies: list[int], events: int, seconds: float) -> dict[str, Cost]:
    defs = load_definitions()
    costs: dict[str, Cost] = {}
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    for n in concurrencies:
        for kind in STACKS:
            db = f"hbcost_{kind}_{uuid.uuid4().hex[:6]}"
            cell = measure(kind, f"worker-{n}", url, db, defs, events, seconds)
            client.drop_database(db)
            costs[f"{kind} {n}"] = cost_of([cell])
            print(f"{kind} x{n}: {cell.events} events", file=sys.stderr, flush=True)
    client.close()
    return costs


SECTION = "cost"

#: how the server's CPU is shared among the kinds, and what that can and cannot say: written
#: with the section, so that every table of what one event costs has it beside it
METHOD = """How the server's CPU is shared among the kinds. The server's CPU over each part is read from
/proc (the run time of its threads): exact for the part as a whole. SecantusDB has no CPU figure per
command: its profiler records whole milliseconds of wall time and writes a document per command (CPU
of its own, added to what is measured), and `top` gives wall time by collection and operation type
only, not by the shape that tells a claim's read from a relay's. So each part's CPU is divided among
the kinds in proportion to their time on the wire: from the driver sending a command until it has
read the reply, summed over the kind's commands, as PyMongo's command listener reports it. What that
cannot say:

- Wire time is not CPU. A command that waits (behind other commands for the server's one interpreter,
  for a journal flush at `j: true`, for the client's event loop to read its reply) is charged as if
  it worked. At concurrency 1 the commands mostly run one at a time and the shares are close to the
  CPU's; at 16 and 64 every command's wait behind the others adds to its share, so the shares drift
  towards the kinds' counts, and a cheap command sent when the server is busiest is over-charged.
- The server's CPU that no command causes (its idle connections' threads, WiredTiger's own work) is
  shared among the kinds in the same proportion.
- The commands per event are counted on the wire, not estimated, and most are fixed by the code (a
  handled event is one load and one commit; a publish and an ack are what each transport makes
  them): the figures to cut against. Not the claims and the sweeps: a worker that finds nothing
  claims again, so those follow the timing, and the machine's load. The CPU figures are this
  machine's, from one run.
- In `make bench-partitions` the workers are processes of their own: each counts its commands through
  `bench/common/tally_child.py`, and the server's CPU is read once over the whole drive, so the kinds
  share it over both parts together."""


def section(
    costs: dict[str, Cost], concurrencies: list[int], argv: str, seconds: float, note: str, loads: list[Any]
) -> str:
    """The section `--out` writes: the run, the note, the method, a table per concurrency."""
    m = machine()
    load = ", ".join("/".join(f"{x:.2f}" for x in la) for la in loads)
    out = [
        "## What one event costs, by kind of work",
        "",
        f"Run {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC with "
        f"`python -m bench.stack.cost{argv}` in {seconds / 60:.1f} min. Machine: {m['cpus']} CPUs, {m['cpu']}; "
        f"Python {m['python']}; harel {m['harel']}, pymongo {m['pymongo']}. Load average (1/5/15 min) at the "
        f"start and the end: {load}.",
    ]
    out += ["", note] if note else []
    out += [
        "",
        "Both stacks under harel's `AsyncWorker`, untraced, on an empty database, as `make bench` runs them "
        "(`make bench` writes the same tables from its own rounds). *worker*: commands per event handled "
        "while the worker drained a wave; *producer*: while the wave was created and its events sent (a "
        "Parcel's create and its four sends). *server CPU*: the server process's CPU over each part, shared "
        "among the kinds as said below. *floor*: one commit and one publish per event, at the CPU this "
        "stack's own commit and publish commands took.",
        "",
        METHOD,
    ]
    for n in concurrencies:
        out += ["", f"Concurrency {n}:", ""]
        out += table([(LABEL[k], costs[f"{k} {n}"]) for k in STACKS])
    return "\n".join(out) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.ERROR)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=200, help="events per stack and concurrency (default 200)")
    p.add_argument("--seconds", type=float, default=60.0, help="time budget per measurement (default 60)")
    p.add_argument("--concurrency", default="1,16,64", help="worker concurrencies (default 1,16,64)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of the tables")
    p.add_argument("--out", help="write the section into this file (between its markers, the rest kept)")
    p.add_argument("--note", default="", help="a line the section carries under its heading (the machine's state)")
    a = p.parse_args(argv)
    concurrencies = [int(x) for x in a.concurrency.split(",") if x]
    t = time.perf_counter()
    loads = [os.getloadavg()]
    with EmbeddedServer() as server:
        TALLY.server_pid = server.proc.pid if server.proc is not None else None
        costs = run(server.url, concurrencies, a.events, a.seconds)
    loads.append(os.getloadavg())
    if a.out:
        shown = f" --events {a.events} --concurrency {a.concurrency}"
        text = section(costs, concurrencies, shown, time.perf_counter() - t, a.note, loads)
        splice(Path(a.out), SECTION, text)
        print(f"written to {a.out}", file=sys.stderr)
    if a.json:
        print(json.dumps(figures(costs), indent=1))
        return 0
    for n in concurrencies:
        print(f"\nConcurrency {n}:\n")
        print("\n".join(table([(LABEL[k], costs[f"{k} {n}"]) for k in STACKS])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
