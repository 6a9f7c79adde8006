"""The benchmark's report, rendered from canned figures: bench/store/report.py's section for one server
and bench/partitions/run.py's section, compared byte for byte with the text kept beside this test
(tests/package/golden/). The smoke run checks the report's shape on real, changing figures;
this one pins every character for fixed ones, so a rework of the report's code that changes
nothing it writes is proven to change nothing, and one that does shows the difference.

The canned figures take every branch the report has: a server whose CPU time is readable and
one where it is not, the fewer-indexes and equal-write-concern cells present and absent, the
index costs, the stacks, latencies and profile, and for the partitions a run with worker
counts, a stalled configuration, a failed warm-up and takeovers beside one with none.

When the report's wording or figures change on purpose, `HB_WRITE_GOLDEN=1` rewrites the
kept text; read its diff before committing it.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.fixture(scope="module")
def bench() -> Iterator[dict[str, Any]]:
    """The benchmark's modules, imported as `python -m bench.store.run` imports them."""
    from bench.common import harness
    from bench.partitions import run as partitions
    from bench.partitions import work as partition_work
    from bench.partitions import workers as partition_workers
    from bench.stack import latency
    from bench.store import indexes, report

    yield {
        "harness": harness,
        "indexes": indexes,
        "latency": latency,
        "partition_work": partition_work,
        "partition_workers": partition_workers,
        "partitions": partitions,
        "report": report,
    }


@pytest.fixture
def fixed_machine(bench: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine the text names, fixed: its CPU count and versions are this machine's otherwise."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    m = {"cpus": "2", "cpu": "a test CPU", "os": "Linux 6", "python": "3.11.9"}
    m |= {"harel": "0.9.0", "pymongo": "4.8.0", "motor": "3.5.0", "beanie": "1.26.0"}
    for name in ("report", "partitions"):
        monkeypatch.setattr(bench[name], "machine", lambda: m)


def _check(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("HB_WRITE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.read_text() == text, f"{name} differs from the kept text: HB_WRITE_GOLDEN=1 rewrites it"


class _Numbers:
    """A deterministic stream of figures, varied enough that no two cells agree by accident."""

    def __init__(self) -> None:
        self.i = 0

    def __call__(self, low: float, span: float) -> float:
        self.i += 1
        return low + span * ((self.i * 7919) % 997) / 997


def _server_run(bench: dict[str, Any], name: str, full: bool) -> Any:
    h = bench["harness"]
    n = _Numbers()
    run = h.ServerRun(name, "mongodb://canned")
    server = "SecantusDB 0.0 (embedded, child process)" if full else "MongoDB 8.0 (MONGODB_URL)"
    run.info = {"server": server, "reports": "MongoDB 7.0.0", "topology": "replica set rs0"}
    run.ceiling = [(n(900, 300), n(2500, 500), n(300, 100)) for _ in range(2)]
    run.load = [(n(0, 3), n(0, 3), n(0, 3)) for _ in range(2)]
    run.stored = 2000
    stores = ["harel", "beanie"] + ([h.BARE, h.OWN, h.EQUAL] if full else [])
    for rnd in range(3):
        for runner in h.RUNNERS:
            for state in h.STATES:
                for store in stores if state == "empty" else ["harel", "beanie"]:
                    run.cells.append(_cell(h, n, runner, state, store, rnd, full))
        for runner in h.STACK_RUNNERS:
            for state in h.STATES:
                for store in h.STACKS:
                    run.cells.append(_cell(h, n, runner, state, store, rnd, full))
    if full:
        _index_figures(bench, run, n)
        run.trips = {k: {op: n(1, 3) for op in ("publish", "claim", "ack")} for k in ("harel", "beanie")}
        Latency = bench["latency"].Latency
        run.latencies = [
            Latency("harel", [n(5, 50) for _ in range(40)], [n(10, 200) for _ in range(9)], n(5, 40)),
            Latency("harel-beanie", [n(5, 50) for _ in range(40)], [], n(5, 40)),
        ]
        run.profile = {k: [(f"module.py:{i}(f{i})", n(0, 0.5)) for i in range(4)] for k in ("harel", "beanie")}
    return run


def _cell(h: Any, n: _Numbers, runner: str, state: str, store: str, rnd: int, cpu: bool) -> Any:
    wire = h.Wire(store=int(n(300, 600)), transport=int(n(0, 900)) if "worker" in runner else 0)
    wire.seconds = {"store update": n(0.1, 0.3), "store find": n(0.05, 0.2)}
    if "worker" in runner:
        wire.seconds["transport findAndModify"] = n(0.1, 0.4)
    wire.client_cpu = n(0.3, 0.5)
    wire.server_cpu = n(0.2, 0.6) if cpu else None
    submit = (100, n(0.1, 0.2)) if "worker" in runner else (0, 0.0)
    return h.Cell(runner, state, store, 100, n(0.8, 1.5), submit[0], submit[1], rnd, wire)


def _index_figures(bench: dict[str, Any], run: Any, n: _Numbers) -> None:
    kinds = list(bench["indexes"].COMMIT_KINDS)
    variants = ["harel", "all", "none", "cost_all"]
    names = ["hb_definition", "hb_status", "hb_status_updated", "hb_parent", "hb_pending_part", "hb_timer_pending"]
    run.index_costs = {v: {k: n(0.1, 2) for k in kinds} for v in variants}
    run.index_costs |= {f"cost-{x}": {k: n(-0.05, 0.3) for k in kinds} for x in names[:-1]}
    run.keys = {k: {x: (int(n(0, 4)), int(n(0, 3))) for x in names} for k in kinds}


def test_the_report_of_a_server_is_the_kept_text(bench: dict[str, Any], fixed_machine: None) -> None:
    report = bench["report"]
    runs = [_server_run(bench, "embedded", full=True), _server_run(bench, "url", full=False)]
    opts = bench["harness"].Options(500, 10.0, 2000, 3, 3000, 200, 9, quick=False)
    text = report.report(runs, opts, datetime.datetime(2025, 1, 2, 3, 4), 1234.5)
    _check("bench_report.md", text)


def _server_figures(bench: dict[str, Any], name: str, full: bool) -> Any:
    pw, pk = bench["partition_work"], bench["partition_workers"]
    n = _Numbers()
    info = {"server": f"{name} server", "reports": "MongoDB 7.0.0", "topology": "standalone"}
    figs = bench["partitions"].ServerFigures(name, info, fresh=full)
    figs.load = [(n(0, 3), n(0, 3), n(0, 3)) for _ in range(2)]
    figs.seeding = {"stored": n(1, 20), "backlog": n(1, 20)}
    for state in ("empty", "backlog"):
        for scope in pw.SCOPES:
            for op in pw.OPS:
                figs.work.append(pw.WorkCell(state, scope, op, int(n(1, 5000)), n(0.5, 80), n(1, 3), 15))
    if not full:  # no worker counts; one takeover whose queued work was never seen claimed
        figs.takeovers = [pk.Takeover(3, n(0, 10), n(5, 10), n(5, 12), float("nan"))]
        return figs
    for workers in (1, 2, 4):
        for stack in pk.STACKS:
            seconds = 0.0 if (stack, workers) == ("harel-own", 4) else n(2, 20)
            drained = (stack, workers) != ("harel", 2)
            figs.rates.append(pk.Rate(stack, workers, 150, 750, seconds, drained, server_cpu=n(2, 20)))
    figs.takeovers = [
        pk.Takeover(8, n(0, 10), n(5, 10), n(5, 12), n(6, 14)),
        pk.Takeover(8, n(0, 10), n(5, 10), n(5, 12), float("nan"), epochs_bumped=False),
        pk.Takeover(7, n(0, 10), float("nan"), float("nan"), float("nan")),
    ]
    return figs


def test_the_partitions_section_is_the_kept_text(bench: dict[str, Any], fixed_machine: None) -> None:
    partitions = bench["partitions"]
    sizes = bench["partition_work"].Sizes(stored=200, backlog=100, queued=100, reps=3)
    opts = partitions.Options(sizes, [1, 2, 4], 150, 30.0, 3, list(bench["partition_workers"].STACKS))
    runs = [_server_figures(bench, "embedded", full=True), _server_figures(bench, "url", full=False)]
    text = partitions.report(runs, opts, datetime.datetime(2025, 1, 2, 3, 4), 456.0, " --stored 200")
    _check("bench_partitions.md", text)
