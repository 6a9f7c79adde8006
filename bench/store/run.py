"""The benchmark: harel's own MongoStore / AsyncMongoStore against harel-beanie's, in one run.

    python -m bench.store.run              # the full run; writes bench/RESULTS.md
    python -m bench.store.run --quick      # a smoke run at tiny sizes (writes nothing unless --out)

It runs on the embedded server (SecantusDB, started here as a child process) and, when
MONGODB_URL is set (or --url is given), on that server too. For each server:

- the ceiling: bare single-document `update_one` by `_id`, one at a time and 16 in flight,
  measured at the start and at the end of the run;
- events/s through harel's engine for both stores, interleaved (each round alternates which
  store goes first): the sync `DurableRunner`, and `AsyncWorker` at concurrency 1 and 16 over
  harel's `AsyncMongoTransport` (the pure-Mongo stack, built as `harel.worker` builds it);
  each on an empty database and on one already holding --stored finished executions;
- this store also at harel's write concern (w:1, the client default) next to its own default
  (w: majority, j: true), on the empty database: both stores at equal durability;
- what each commit kind costs (create, state-only, traced, with an emit and its ack, with a
  spawn and its ack, arming a timer and deleting it): ms with every index, with none, with
  all but one, and harel's store doing the same; and the index keys each kind writes.

The workload is models/bench/parcel.stm: five events (Start, then four steps) take an execution from
PENDING to DONE, each one engine step and one commit. Every runner runs twice: as harel builds
it by default, and traced (`trace=True`: the engine writes one trace step per commit, the step
log `harel-beanie status` and dashboards read), because that is where harel's store pays an
extra counter round trip per commit and this one pays none. For a worker, work goes in waves of
max(4, concurrency) executions: a wave is created and its events queued (timed apart, as
"submit"), then the worker drains it (the figure), so the queue is equally short for both stores.
Speed is the embedded server's, a Python server far slower than mongod: compare the two stores
side by side, and each with the ceiling measured in the same run, never across machines.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import pymongo
from harel.definition.model import Definition

from bench.common.harness import (
    BARE,
    BARE_RUNNERS,
    EQUAL,
    EQUAL_RUNNERS,
    HERE,
    OWN,
    RUNNERS,
    STACK_PREFIX,
    STACK_RUNNERS,
    STACKS,
    STATES,
    STORES,
    Options,
    ServerRun,
    load_definitions,
    server_info,
)
from bench.common.sections import kept
from bench.common.wire import TALLY
from bench.stack.latency import latencies, profile, round_trips
from bench.store.growth import finished_template, seed
from bench.store.indexes import index_costs, keys_written
from bench.store.report import report
from bench.store.throughput import ceiling, measure
from harel_beanie.deploy.embedded import EmbeddedServer

# --- the run ----------------------------------------------------------------------------------


def run_stacks(
    run: ServerRun, url: str, opts: Options, defs: dict[str, Definition], stored_db: dict[str, str], tag: str, say: Any
) -> None:
    """The production stacks side by side, in rounds of their own (each store on its own
    transport), and the transports' round trips per message."""
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    for r in range(opts.stack_rounds):
        for state in STATES:
            for runner in STACK_RUNNERS:
                for kind in STACKS if r % 2 == 0 else tuple(reversed(STACKS)):
                    store = kind.removeprefix(STACK_PREFIX)
                    db = stored_db[store] if state == "stored" else f"hbbench_{tag}_{kind}_{uuid.uuid4().hex[:4]}"
                    cell = measure(kind, runner, url, db, defs, opts.events, opts.seconds)
                    cell.state, cell.round = state, r
                    run.cells.append(cell)
                    if state == "empty":
                        client.drop_database(db)
                    say(f"stack round {r + 1} {runner:9s} {state:6s} {kind:12s} {cell.rate:8.1f} events/s")
    client.close()
    run.trips = round_trips(url)
    say(f"round trips per message: {run.trips}")


def run_server(name: str, url: str, opts: Options, defs: dict[str, Definition]) -> ServerRun:
    """One server's run: the ceiling, the stores' rounds and the stacks', the profiles, the
    ceiling again, and the index costs; the stored databases are dropped whatever happens."""
    run = ServerRun(name, url, info=server_info(name, url), stored=opts.stored)
    say = lambda msg: print(f"[{name}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    tag = uuid.uuid4().hex[:6]
    run.load.append(os.getloadavg())
    say(f"{run.info['server']}; ceiling ...")
    run.ceiling.append(ceiling(url, opts.ceiling_updates))
    say(
        f"ceiling {run.ceiling[-1][0]:.0f} updates/s sequential, {run.ceiling[-1][1]:.0f} with 16 in flight, "
        f"{run.ceiling[-1][2]:.0f} on an indexed collection"
    )
    stored_db = {}
    for kind in STORES:
        stored_db[kind] = f"hbbench_{tag}_{kind}_stored"
        seconds = seed(kind, url, stored_db[kind], opts.stored, finished_template(kind, url, defs))
        say(f"seeded {opts.stored} finished executions for {kind} in {seconds:.1f}s")
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    try:
        run_rounds(run, client, url, opts, defs, stored_db, tag, say)
        run_stacks(run, url, opts, defs, stored_db, tag, say)
        say("profiles of the client per event ...")
        run.profile = profile(url, defs, opts.profile_events)
        run.ceiling.append(ceiling(url, opts.ceiling_updates))
        run.load.append(os.getloadavg())
        say(f"ceiling again {run.ceiling[-1][0]:.0f} / {run.ceiling[-1][1]:.0f}")
        if opts.index_commits:
            say("index costs ...")
            run.index_costs = index_costs(url, opts.index_commits, opts.index_blocks)
            run.keys = keys_written(url)
    finally:
        for db in stored_db.values():
            client.drop_database(db)
        client.close()
    return run


def run_rounds(
    run: ServerRun,
    client: pymongo.MongoClient[Any],
    url: str,
    opts: Options,
    defs: dict[str, Definition],
    stored_db: dict[str, str],
    tag: str,
    say: Any,
) -> None:
    """The stores' rounds: every runner on each database state, each store (and on the empty
    database the fewer-indexes and equal-write-concern variants), the order reversed every other
    round; an empty database is dropped after its cell."""
    for r in range(opts.rounds):
        for state in STATES:
            for runner in RUNNERS:
                kinds = STORES + ((BARE, OWN) if state == "empty" and runner in BARE_RUNNERS else ())
                kinds += (EQUAL,) if state == "empty" and runner in EQUAL_RUNNERS else ()
                order = kinds if r % 2 == 0 else tuple(reversed(kinds))
                for kind in order:
                    db = stored_db[kind] if state == "stored" else f"hbbench_{tag}_{kind}_empty_{uuid.uuid4().hex[:4]}"
                    cell = measure(kind, runner, url, db, defs, opts.events, opts.seconds)
                    cell.state, cell.round = state, r
                    run.cells.append(cell)
                    if state == "empty":
                        client.drop_database(db)
                    say(
                        f"round {r + 1} {runner:9s} {state:6s} {kind:6s} {cell.rate:8.1f} events/s ({cell.events} in {cell.seconds:.1f}s)"
                    )


def parse_args(argv: Optional[list[str]] = None) -> tuple[Options, argparse.Namespace]:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a smoke run at tiny sizes (writes no RESULTS.md unless --out)")
    p.add_argument("--events", type=int, help="events per measurement (default 400; quick 10)")
    p.add_argument("--seconds", type=float, help="time budget per measurement (default 15; quick 5)")
    p.add_argument("--stored", type=int, help="finished executions in the 'stored' database (default 20000; quick 100)")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 5; quick 1)")
    p.add_argument(
        "--index-commits", type=int, help="commits per index variant and block (default 40; quick 4; 0 skips)"
    )
    p.add_argument(
        "--url", default=os.environ.get("MONGODB_URL"), help="also run on this server (default $MONGODB_URL)"
    )
    p.add_argument("--no-embedded", action="store_true", help="skip the embedded server (needs --url)")
    p.add_argument("--stack-rounds", type=int, help="rounds of the stacks side by side (default 3; quick 1)")
    p.add_argument("--out", help="write the markdown here (default bench/RESULTS.md; quick: nowhere)")
    a = p.parse_args(argv)
    q = a.quick
    opts = Options(
        events=a.events or (10 if q else 400),
        seconds=a.seconds or (5.0 if q else 15.0),
        stored=a.stored if a.stored is not None else (100 if q else 20_000),
        rounds=a.rounds or (1 if q else 5),
        ceiling_updates=50 if q else 2_000,
        index_commits=a.index_commits if a.index_commits is not None else (4 if q else 40),
        index_blocks=2 if q else 12,
        quick=q,
        stack_rounds=a.stack_rounds or (1 if q else 3),
        latency_events=6 if q else 60,
        timers=3 if q else 20,
        profile_events=20 if q else 300,
    )
    return opts, a


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.ERROR)
    opts, a = parse_args(argv)
    if a.no_embedded and not a.url:
        print("--no-embedded needs --url or MONGODB_URL", file=sys.stderr)
        return 2
    defs = load_definitions()
    started = datetime.datetime.now(datetime.timezone.utc)
    t = time.perf_counter()
    runs = []
    if not a.no_embedded:
        with EmbeddedServer() as server:
            TALLY.server_pid = server.proc.pid if server.proc is not None else None
            try:
                runs.append(run_server("embedded", server.url, opts, defs))
            finally:
                TALLY.server_pid = None
            # latency: idle workers woken by polling (this standalone server) or by change
            # streams (the same server as a one-member replica set)
            with EmbeddedServer(standalone=False) as replica:
                print("[embedded] latency and timer lateness ...", file=sys.stderr, flush=True)
                runs[-1].latencies = latencies(server.url, replica.url, defs, opts.latency_events, opts.timers)
    if a.url:
        runs.append(run_server("url", a.url, opts, defs))
    text = report(runs, opts, started.replace(tzinfo=None), time.perf_counter() - t)
    print(text)
    out = a.out or (None if opts.quick else str(HERE / "RESULTS.md"))
    if out:
        Path(out).write_text(text + kept(Path(out)))  # other benchmarks' sections stay
        print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
