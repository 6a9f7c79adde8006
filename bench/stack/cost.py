"""What one event costs each production stack, by kind of work (bench/common/cost.py): the
section `make bench` writes from its stack cells, and a small run of its own.

    python -m bench.stack.cost                       # both stacks at concurrency 1, 16 and 64
    python -m bench.stack.cost --events 20 --concurrency 1 --json

The run measures the stacks as `make bench` does (bench/store/throughput.py: harel's
`AsyncWorker` on each store and its own transport, waves of Parcels on an empty database, the
embedded server started here so its CPU can be read), and prints the tables; with `--json`, the
figures as JSON instead (what the smoke test reads).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import uuid
from typing import Any, Optional

import pymongo

from bench.common.cost import Cost, table
from bench.common.harness import LABEL, STACK_BASE_RUNNERS, STACKS, Cell, ServerRun, load_definitions
from bench.common.kinds import ALL
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
        "kinds by their time on the wire in that part (bench/common/cost.py; what that can say is under "
        '"What one event costs" below the tables). *floor*: one commit and one publish, at the CPU this '
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


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.ERROR)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=200, help="events per stack and concurrency (default 200)")
    p.add_argument("--seconds", type=float, default=60.0, help="time budget per measurement (default 60)")
    p.add_argument("--concurrency", default="1,16,64", help="worker concurrencies (default 1,16,64)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of the tables")
    a = p.parse_args(argv)
    concurrencies = [int(x) for x in a.concurrency.split(",") if x]
    with EmbeddedServer() as server:
        TALLY.server_pid = server.proc.pid if server.proc is not None else None
        costs = run(server.url, concurrencies, a.events, a.seconds)
    if a.json:
        print(json.dumps(figures(costs), indent=1))
        return 0
    for n in concurrencies:
        print(f"\nConcurrency {n}:\n")
        print("\n".join(table([(LABEL[k], costs[f"{k} {n}"]) for k in STACKS])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
