"""The scale benchmark (`make bench-scale`): what every operation costs as the database grows
to 10,000, 100,000 and 1,000,000 stored executions.

    python -m bench.scale.run                          # all three sizes; writes its section and chart
    python -m bench.scale.run --sizes 10000,100000     # some of them
    python -m bench.scale.run --sizes 200,400 --out X.md --chart X.png   # the smoke test's run

One database is grown in place from one size to the next (bench/scale/seed.py says how: runs of
the shop models through harel's runner, cloned). At each size it measures the median wall time
of a few repeats (a time budget bounds them) of: every dashboard route and `/metrics` (the
`harel-beanie dashboard` command, over HTTP), `harel-beanie status` (the command line), the
first page of each listing and search and the status counts (the queries API), the store's
operations on this package's MongoStore and, beside them, on harel's MongoStore over as many
executions in its own layout (bench/scale/store.py), the transport's claim with one queue
document per execution, prune's rate over the first and the last batches of a bounded run,
`migrate up` of executions harel's store wrote (bench/scale/upkeep.py), and the memory of
the embedded server's process.

It runs on the embedded server (SecantusDB, a child process) and, when MONGODB_URL is set
(or --url given), on that server too. The report (bench/scale/report.py) goes between its
markers in bench/RESULTS.md, the chart into docs/.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pymongo
from harel.engine.schema import DEFAULT_PREFIX

from bench.common.harness import HERE, machine, server_info
from bench.common.sections import splice
from bench.scale.operator import (
    SAMPLE,
    dashboard_ms,
    queries_ms,
    routes,
    rss_mb,
    sample_ms,
    searches,
    status_ms,
    views_read,
)
from bench.scale.report import Figures, draw, section
from bench.scale.seed import EXECUTIONS, KINDS, SHARE, SPAN_DAYS, Cloner, Family, grow, make_templates, parse_shares
from bench.scale.store import Picks, claim_ms, count_statuses, seed_queue, store_ops
from bench.scale.upkeep import migrate_rates, prune_rates
from harel_beanie import MongoStore
from harel_beanie.core.count_documents import counts_collection
from harel_beanie.deploy.embedded import BOUNDED_MEMORY, EmbeddedServer

SECTION = "scale"
SIZES = (10_000, 100_000, 1_000_000)
DB, HAREL_DB, MIGRATE_DB = "hbscale", "hbscale_harel", "hbscale_migrate"


class Run:
    """One server's run: its databases, the clones' generators and the figures."""

    def __init__(self, name: str, url: str, pid: Optional[int], opts: argparse.Namespace) -> None:
        self.name, self.url, self.pid, self.opts = name, url, pid, opts
        self.figs = Figures(name, server_info(name, url))
        self.client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)

    def say(self, msg: str) -> None:
        print(f"[{self.name} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def start(self) -> None:
        for db in (DB, HAREL_DB, MIGRATE_DB):
            self.client.drop_database(db)
        families: list[Family] = make_templates(self.url, "hbscale_templates")
        now = time.time()
        shape = {"share": self.opts.shares, "waits": self.opts.wait_days}
        self.ours, self.theirs = Cloner(families, "beanie", now, 1, **shape), Cloner(families, "harel", now, 2, **shape)
        self.moving = Cloner(families, "harel", now, 3, **shape)
        MongoStore(self.client, DB).init()  # the layout marker and the indexes, on an empty database
        self.say(f"{len(families)} template families from the shop models")

    def reindex(self) -> None:
        MongoStore(self.client, DB).init()

    def size(self, n: int) -> None:
        """Grow to `n`, then measure everything at `n`."""
        o, figs = self.opts, self.figs
        figs.sizes.append(n)
        self.say(f"growing to {n:,} executions")
        figs.seeding[n] = grow(self.client[DB][EXECUTIONS], self.ours, n, self.say, self.reindex)
        grow(self.client[HAREL_DB][EXECUTIONS], self.theirs, n, self.say, lambda: None)
        seed_queue(self.url, DB, n, self.say)
        # the clones are written without the counts' bookkeeping: fold them once, as a worker's
        # sweeps (or `migrate up`) keep the counters of a real deployment, before any reader
        # (the clones arrive counted but the counters know only what they summed: they are
        # summed again from the documents' states, one read per partition)
        started = time.perf_counter()
        self.client[DB][counts_collection(DEFAULT_PREFIX)].delete_many({})
        MongoStore(self.client, DB, create_schema=False).fold_counts(
            build_batch=0
        )  # one pass: this server reads the collection per id batch
        figs.put("counts: fold the seeded executions (once)", n, (time.perf_counter() - started) * 1000)
        figs.counts[n] = count_statuses(self.url, DB)
        self.say(f"measuring at {n:,}: {figs.counts[n]}")
        ours = store_ops("beanie", self.url, DB, Picks(self.ours), o.reps, o.budget, o.timeout)
        theirs = store_ops("harel", self.url, HAREL_DB, Picks(self.theirs), o.reps, o.budget, o.timeout)
        for op, ms in ours.items():
            figs.put(op, n, ms, theirs.get(op))
        figs.put("claim", n, claim_ms(self.url, DB, o.reps, o.budget, o.timeout))
        self.say(f"  store: {ours}")
        self._operator(n)
        usage = rss_mb(self.pid)
        if usage is not None:
            figs.rss[n] = usage
        self._upkeep(n)

    def _operator(self, n: int) -> None:
        o, picks, now = self.opts, self.ours.picked, time.time()
        prefix = picks["finished"][0][:4]
        parent = picks["timer"][0]
        for name, ms in queries_ms(self.url, DB, searches(prefix, parent, now), o.reps, o.budget, o.timeout).items():
            self.figs.put(name, n, ms)
        self.figs.put(SAMPLE, n, sample_ms(self.url, DB))
        paths = routes(prefix, parent, picks["failed"][0], now)
        for name, ms in dashboard_ms(self.url, DB, paths, o.reps, o.budget, o.timeout, self.say).items():
            self.figs.put(name, n, ms)
        sample_ms(self.url, DB)  # as a worker keeps one: the dashboard's may be a minute old by now
        self.figs.put(
            "`harel-beanie status --json` (the command line)", n, status_ms(self.url, DB, o.reps, o.budget, o.timeout)
        )
        for view, docs in views_read(self.url, DB).items():
            self.figs.reads.setdefault(view, {})[n] = docs

    def _upkeep(self, n: int) -> None:
        o = self.opts
        if o.prune:
            self.say(f"  prune, at most {o.prune:,}")
            self.figs.prune[n], removed = prune_rates(self.url, DB, o.prune)
            gone = set(removed)
            for kind, ids in self.ours.picked.items():
                ids[:] = [i for i in ids if i not in gone] or ids
        if o.migrate:
            self.say(f"  migrate up, {min(n, o.migrate):,} executions")
            rates, seconds = migrate_rates(self.url, MIGRATE_DB, self.moving, n, o.migrate, self.say)
            self.figs.migrate[n] = (min(n, o.migrate), rates, seconds)

    def finish(self) -> None:
        try:
            for db in (DB, HAREL_DB, MIGRATE_DB):
                self.client.drop_database(db)
        except pymongo.errors.PyMongoError as exc:  # the embedded server is thrown away anyway
            self.say(f"dropping the databases failed ({exc}); the figures are kept")
        self.client.close()


def run_server(
    name: str, url: str, pid: Optional[int], opts: argparse.Namespace, write: Callable[[Figures], None]
) -> Figures:
    """Every size in turn on one server; `write(figures)` after each, so that a long run that is
    stopped keeps what it measured."""
    run = Run(name, url, pid, opts)
    run.figs.load.append(os.getloadavg())
    try:
        run.start()
        for n in opts.sizes:
            run.size(n)
            write(run.figs)
    finally:
        run.finish()
    run.figs.load.append(os.getloadavg())
    write(run.figs)
    return run.figs


def header(opts: argparse.Namespace, started: datetime.datetime, seconds: float, argv: str) -> list[str]:
    m = machine()
    return [
        f"Run {started:%Y-%m-%d %H:%M} UTC with `python -m bench.scale.run{argv}` in {seconds / 60:.1f} min.",
        f"Machine: {m['cpus']} CPUs, {m['cpu']}; {m['os']}; Python {m['python']}; harel {m['harel']}, "
        f"pymongo {m['pymongo']}.",
        f"Each figure: the median of up to {opts.reps} repeats after one warm-up, fewer once {opts.budget:g} s "
        f"are spent (one request slower than that is its own figure); *timed out*: one call took longer than "
        f"{opts.timeout:g} s. Executions seeded as bench/scale/seed.py "
        f"says: the shop models run by harel's runner, cloned ({shares(opts.shares)} of the roots; the ones "
        f"waiting on a timer 1 to {opts.wait_days:g} days ahead, last updated over as many days; the finished "
        "and FAILED ones over 30 days, the outbox work over a week, none relayed). Prune: `--finished-before 7d` in batches of 500, "
        f"stopped after {opts.prune:,} executions, its rate taken over the batches that did the first and the last "
        f"third of its executions. Migrate up: min(size, {opts.migrate:,}) executions written "
        "by harel's MongoStore, a database of their own. The machine is shared: compare within one run.",
    ]


def shares(share: dict[str, float]) -> str:
    total = sum(share.values()) or 1.0
    words = {"finished": "finished", "timer": "waiting on a timer", "failed": "FAILED", "outbox": "holding outbox work"}
    return ", ".join(f"{100 * share[k] / total:g}% {words[k]}" for k in KINDS if share.get(k))


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sizes", default=",".join(map(str, SIZES)), help="executions, ascending (default 10000,100000,1000000)"
    )
    p.add_argument("--reps", type=int, default=5, help="timed repeats per operation (default 5)")
    p.add_argument("--budget", type=float, default=15.0, help="seconds of repeats per operation (default 15)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one call may take (default 120)")
    p.add_argument("--prune", type=int, default=5_000, help="executions one prune run removes at most (0: skip)")
    p.add_argument("--migrate", type=int, default=100_000, help="executions migrated at most per size (0: skip)")
    default_shares = ",".join(f"{k}={v:g}" for k, v in SHARE.items())
    p.add_argument(
        "--shares",
        default=default_shares,
        help=f"the roots' kinds, as weights (default {default_shares}): finished, waiting on a timer, FAILED, "
        "holding unrelayed outbox work",
    )
    p.add_argument(
        "--wait-days",
        type=float,
        default=float(SPAN_DAYS),
        help=f"how many days ahead the waiting executions' timers are, and over how many their last updates "
        f"spread (default {SPAN_DAYS})",
    )
    p.add_argument("--url", default=os.environ.get("MONGODB_URL"), help="also run on this server ($MONGODB_URL)")
    p.add_argument(
        "--storage",
        metavar="DIR",
        help="the embedded server's data directory (default: in memory, which holds every document in RAM)",
    )
    p.add_argument("--no-url", action="store_true", help="ignore MONGODB_URL (the embedded server only)")
    p.add_argument("--no-embedded", action="store_true", help="skip the embedded server (needs --url)")
    p.add_argument("--out", default=str(HERE / "RESULTS.md"), help="the file the section goes in")
    p.add_argument("--chart", default=str(HERE.parent / "docs" / "scale.png"), help="the chart's PNG")
    a = p.parse_args(argv)
    if a.no_url:
        a.url = None
    a.sizes = sorted(int(s.replace("_", "")) for s in a.sizes.split(",") if s)
    try:
        a.shares = parse_shares(a.shares)
    except ValueError as exc:
        p.error(str(exc))
    if not a.wait_days >= 1:
        p.error("--wait-days must be 1 or more")
    if a.no_embedded and not a.url:
        p.error("--no-embedded needs --url or MONGODB_URL")
    return a


def main(argv: Optional[list[str]] = None) -> int:
    opts = parse_args(argv)
    # a SIGTERM unwinds like Ctrl-C: the embedded server is stopped and the databases dropped
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    started = datetime.datetime.now(datetime.timezone.utc)
    t = time.perf_counter()
    done: list[Figures] = []
    chart, out = Path(opts.chart), Path(opts.out)
    shown = " ".join(sys.argv[1:] if argv is None else argv)

    def write(figs: Figures) -> None:
        runs = [*done, figs]
        draw(runs, chart)
        link = os.path.relpath(chart.resolve(), HERE.parent)  # from the repository's top
        when = header(opts, started.replace(tzinfo=None), time.perf_counter() - t, f" {shown}" if shown else "")
        splice(out, SECTION, section(runs, when, link))
        print(f"written to {out} and {chart} ({', '.join(f'{n:,}' for n in figs.sizes)})", file=sys.stderr)

    if not opts.no_embedded:
        # its memory bounded to about one whole-collection read at a time (BOUNDED_MEMORY): with
        # glibc's pool per connection it held 9.4 GB at 300,000, and a million would not fit
        with EmbeddedServer(opts.storage, env=BOUNDED_MEMORY) as server:
            done.append(run_server("embedded", server.url, server.proc.pid if server.proc else None, opts, write))
    if opts.url:
        done.append(run_server("url", opts.url, None, opts, write))
    return 0


if __name__ == "__main__":
    sys.exit(main())
