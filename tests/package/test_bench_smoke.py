"""The benchmark runs: `bench/store/run.py --quick` and `bench/partitions/run.py` at tiny sizes, end to end,
so they cannot rot unnoticed.

It starts its own embedded server (and also uses MONGODB_URL when that is set), measures both
stores through harel's runners at tiny sizes and writes its markdown report; the figures are
not checked (speed lives in the benchmark, never in tests), the report's shape is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_quick_run_writes_a_report(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    done = subprocess.run(
        [sys.executable, "-m", "bench.store.run", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    text = out.read_text()
    assert "SecantusDB" in text or "MONGODB_URL" in text
    runners = ("DurableRunner (sync)", "AsyncWorker, concurrency 1", "AsyncWorker, concurrency 16")
    for row in runners + tuple(r + ", traced" for r in runners):
        for state in ("empty", "stored"):
            line = next((ln for ln in text.splitlines() if ln.startswith(f"| {row} | {state} |")), None)
            assert line is not None, f"no row for {row} / {state}"
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert all(c not in ("", "-") for c in cells[2:5]), line  # both stores measured, ratio
    assert "Ceiling" in text and "### What each commit kind costs, and each index" in text
    assert "### At equal write concern" in text and "harel-beanie at w:1" in text
    # round trips per event, counted on the wire: harel's traced commit takes a counter round
    # trip that this store's does not (a structural fact, so the smoke run can check it)
    section = text[text.index("Round trips per event") : text.index("Submitting the worker's work")]
    trips = {}
    for ln in section.splitlines():
        if ln.startswith(("| DurableRunner", "| AsyncWorker")):
            cells = [c.strip() for c in ln.strip("|").split("|")]
            trips[(cells[0], cells[1])] = cells[2:]
    harel_plain, ours_plain = map(float, trips[("DurableRunner (sync)", "empty")][:2])
    harel_traced, ours_traced = map(float, trips[("DurableRunner (sync), traced", "empty")][:2])
    assert ours_traced == ours_plain and harel_traced > harel_plain
    # a worker's event goes through harel's transport as well as the store
    store_h, store_b, transport = trips[("AsyncWorker, concurrency 1", "empty")]
    assert float(store_h) > 0 and float(store_b) > 0
    assert all(float(x) > 0 for x in transport.split(" / "))
    assert "`hb_pending_part`" in text and "`hb_timer_pending`" in text
    # the relay reads both kinds of entry in one round trip: fewer per event than harel's store
    assert ours_plain < harel_plain
    # fewer indexes: `_id` only and only the store's own reads' indexes, beside the full set
    fewer = text[text.index("### With fewer indexes") : text.index("### Where an event's time goes")]
    for row in runners + tuple(r + ", traced" for r in runners):
        line = next(ln for ln in fewer.splitlines() if ln.startswith(f"| {row} |"))
        assert all(c.strip() not in ("", "-") for c in line.strip("|").split("|")), line
    # where an event's time goes: the commands' wire time by side, and the server's CPU
    split = text[text.index("### Where an event's time goes") : text.index("### The stacks side by side")]
    parts = {}
    for ln in split.splitlines():
        if ln.startswith(("| DurableRunner", "| AsyncWorker")):
            cells = [c.strip() for c in ln.strip("|").split("|")]
            parts[(cells[0], cells[1])] = [float("nan") if c == "-" else float(c.split(" ")[0]) for c in cells[2:]]
    for store in ("harel MongoStore", "harel-beanie, `_id` only", "harel-beanie"):
        event, ours, updates, transport, _client, client_cpu, server_cpu = parts[("AsyncWorker, concurrency 1", store)]
        assert event > 0 and ours >= updates > 0 and transport > 0 and client_cpu > 0, store
        assert server_cpu > 0  # read from the embedded server's process (the first section)
        assert parts[("DurableRunner (sync)", store)][3] == 0.0  # no transport in a DurableRunner
    # the stacks side by side: both measured in every row, with the ratio; the transports' round
    # trips per message on the wire (this package's: one command per publish and ack, two per
    # claim: a window of the claim key read, then the lease)
    stacks = text[text.index("### The stacks side by side") : text.index("### Round trips per message")]
    rows = [ln for ln in stacks.splitlines() if ln.startswith("| AsyncWorker") and ln.count("|") == 7]
    assert len(rows) == 12, rows  # concurrency 1, 16, 64; traced or not; empty and stored
    assert all(c.strip() not in ("", "-", "-x") for r in rows for c in r.strip("|").split("|")[2:5]), rows
    trips = text[text.index("### Round trips per message") : text.index("### Event-to-handler latency")]
    per_op = {
        ln.split("|")[1].strip(): ln.split("|")[2:4]
        for ln in trips.splitlines()
        if ln.startswith("| p") or ln.startswith("| c") or ln.startswith("| a")
    }
    assert {op: float(ours) for op, (_, ours) in per_op.items()} == {"publish": 1.0, "claim": 2.0, "ack": 1.0}
    assert all(float(harel) > 1.0 for harel, _ in per_op.values())
    latency = text[text.index("### Event-to-handler latency") : text.index("### Where the client's time goes")]
    assert sum(1 for ln in latency.splitlines() if ln.startswith("| harel")) == 3  # the three setups
    assert "### Where the client's time goes per event" in text
    for n in (1, 16, 64):
        _cost_table(text[text.index("### What one event costs") :], f"Concurrency {n}:", 2)


def _cost_table(text: str, title: str, stacks: int) -> None:
    """The per-event cost table under `title` (bench/common/cost.py): a row per kind of work,
    the total and the floor, and for each of `stacks` stacks its commands per event (worker,
    producer), server CPU ms and share; every event handled is at least one load and one commit."""
    from bench.common.kinds import KINDS

    lines = text[text.index(title) :].split("\n\n", 2)[1].splitlines()  # the table after the title
    rows = {ln.split("|")[1].strip(): ln.strip().strip("|").split("|")[1:] for ln in lines[2:]}
    assert set(KINDS) <= set(rows) and "**all**" in rows and "*floor: one commit, one publish*" in rows, rows
    assert all(len(cells) == 4 * stacks for cells in rows.values()), rows
    for s in range(stacks):
        assert float(rows["load"][4 * s]) >= 1.0 and float(rows["commit"][4 * s]) >= 1.0, rows
        assert float(rows["**all**"][4 * s + 2]) > 0 and rows["**all**"][4 * s + 3].strip() == "100%", rows


def test_bench_partitions_writes_its_section_and_keeps_the_rest(tmp_path: Path) -> None:
    """`bench/partitions/run.py` at tiny sizes, one worker count, no kills: its section replaces
    the previous one between its markers, and the rest of the file (bench/store/run.py's report)
    stays. Shapes only, no timings."""
    out = tmp_path / "RESULTS.md"
    old = "<!-- section partitions: begin -->\nold figures\n<!-- section partitions: end -->\n"
    out.write_text("# Benchmark results\n\nthe main report\n\n" + old + "\nafter it\n")
    argv = [
        sys.executable,
        "-m",
        "bench.partitions.run",
        "--stored",
        "200",
        "--backlog",
        "100",
        "--queued",
        "100",
        "--reps",
        "3",
        "--workers",
        "1",
        "--executions",
        "6",
        "--kills",
        "0",
        "--budget",
        "30",
        "--out",
        str(out),
    ]
    # the bench bounds each of its waits (a worker's start and share 60 s each, a drain 30 s)
    # and prints the workers' logs when one runs out: well inside this limit, so that a stall
    # shows where the workers stood rather than a kill of the whole run
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-6000:]
    text = out.read_text()
    assert text.startswith("# Benchmark results\n\nthe main report\n") and text.endswith("\nafter it\n")
    assert "old figures" not in text
    assert text.count("<!-- section partitions: begin -->") == 1 == text.count("<!-- section partitions: end -->")
    assert "SecantusDB" in text and "Reduced from the full sizes" in text
    work = text[text.index("#### Work per operation") : text.index("#### Events/s per number")]
    rows = [ln for ln in work.splitlines() if ln.startswith("| ") and not ln.startswith("| operation")]
    assert len(rows) == 12, rows  # 4 operations x (1 of 16, 16 of 16, no partitions)
    for ln in rows:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert cells[2].replace(",", "").isdigit() and cells[3].replace(",", "").isdigit(), ln
        assert float(cells[4]) > 0 and float(cells[5]) > 0, ln
    # the post-commit relay read selects its own family however large the backlog; before
    # partitions it selected every pending document
    relay = {c[1]: c for c in ([x.strip() for x in ln.strip("|").split("|")] for ln in rows) if "relay read" in c[0]}
    assert relay["1 of 16 owned"][2] == relay["1 of 16 owned"][3] == "1"
    assert int(relay["no partitions (before)"][3]) > int(relay["no partitions (before)"][2])
    rates = text[text.index("#### Events/s per number") : text.index("#### What they show")]
    line = next(ln for ln in rates.splitlines() if ln.startswith("| 1 |"))
    # three stacks, two ratios; every configuration drained (a stall prints its workers' logs)
    assert line.count("|") == 7 and "failed" not in line and "not drained" not in line, (line, done.stderr[-6000:])
    assert "#### Takeover" not in text  # no kills asked for
    _cost_table(text[text.index("#### What one event costs") :], "1 worker process:", 3)


def test_a_rewrite_of_the_results_keeps_the_marked_sections(tmp_path: Path) -> None:
    """bench/store/run.py rewrites RESULTS.md whole; the sections other benchmarks put between their
    markers come along (`sections.kept`), and `splice` replaces only its own section."""
    from bench.common import sections

    out = tmp_path / "RESULTS.md"
    sections.splice(out, "partitions", "first figures")
    sections.splice(out, "other", "other figures")
    sections.splice(out, "partitions", "second figures")
    text = out.read_text()
    assert "first figures" not in text and text.count("second figures") == 1 and "other figures" in text
    rewritten = "# Benchmark results\n\nthe main report\n" + sections.kept(out)
    assert rewritten.index("second figures") < rewritten.index("other figures")
    assert rewritten.count("<!-- section partitions: begin -->") == 1 == rewritten.count("<!-- section other: end -->")


def test_bench_scale_writes_its_section_and_chart(tmp_path: Path) -> None:
    """`bench/scale/run.py` at two tiny sizes, end to end on its own embedded server: every
    operation has a figure at both sizes (the dashboard's routes, status, the queries, the
    store beside harel's, the claim), prune and migrate report rates, the documents the
    operator's views read are counted, the data's shape follows `--shares` and `--wait-days`,
    the section lands between its markers with the rest of the file kept, and the chart is a
    PNG. Shapes only."""
    out, chart = tmp_path / "RESULTS.md", tmp_path / "scale.png"
    out.write_text("# Benchmark results\n\nthe main report\n")
    argv = [sys.executable, "-m", "bench.scale.run", "--sizes", "150,300", "--reps", "1", "--budget", "1"]
    argv += ["--prune", "100", "--migrate", "300", "--no-url", "--out", str(out), "--chart", str(chart)]
    argv += ["--shares", "finished=90,timer=7,failed=2,outbox=1", "--wait-days", "20"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    text = out.read_text()
    assert text.startswith("# Benchmark results\n\nthe main report\n")
    assert text.count("<!-- section scale: begin -->") == 1 == text.count("<!-- section scale: end -->")
    assert "SecantusDB" in text and "scale.png" in text
    assert chart.read_bytes().startswith(b"\x89PNG")
    assert "90% finished, 7% waiting on a timer, 2% FAILED, 1% holding outbox work" in text  # --shares
    assert "1 to 20 days ahead" in text  # --wait-days
    # the documents each operator view reads, at both sizes
    reads = text[text.index("#### What the operator's views read") :]
    read_rows = [ln for ln in reads.splitlines() if ln.startswith("| `")]
    assert len(read_rows) == 3, read_rows
    for ln in read_rows:
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        assert all(c.replace(",", "").isdigit() for c in cells[1:3]), ln
    times = text[text.index("#### Time per operation") : text.index("#### The store's operations beside")]
    rows = {ln.split("|")[1].strip(): ln for ln in times.splitlines() if ln.startswith("| ") and "---" not in ln}
    for name in ("GET / (front page)", "GET /metrics", "GET /?status=FAILED", "GET /backlog", "store: `load`"):
        assert name in rows, (name, list(rows))
    expected = {"queries: `status_counts()`", "`harel-beanie status --json` (the command line)"}
    assert expected <= set(rows), list(rows)
    for name, line in rows.items():
        if name == "operation (ms)":
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert all(c not in ("", "-", "timed out") for c in cells[1:3]), line  # a figure at both sizes
    beside = text[text.index("#### The store's operations beside") : text.index("#### Seeding, memory")]
    store_rows = [ln for ln in beside.splitlines() if ln.startswith("| store:")]
    assert len(store_rows) == 7, store_rows  # every store operation, harel's MongoStore measured too
    assert all("-" not in [c.strip() for c in ln.strip("|").split("|")] for ln in store_rows), store_rows
    upkeep = [
        ln for ln in text[text.index("#### Seeding, memory") :].splitlines() if ln.startswith(("| 150 |", "| 300 |"))
    ]
    assert len(upkeep) == 2, upkeep
    for ln in upkeep:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert cells[4] != "-" and cells[5].endswith("/s"), ln  # prune ran and has a rate
        assert cells[7] != "-" and cells[9].endswith("/s"), ln  # migrate up ran and has a rate


def test_bench_claim_backlog_runs_at_tiny_sizes() -> None:
    """`bench/stack/claim_backlog.py` at tiny sizes, end to end on its own embedded server: its
    figures' shape (every message drained, with and without prefetch), not their values."""
    argv = [sys.executable, "-m", "bench.stack.claim_backlog", "--groups", "40", "--claims", "3"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-6000:]
    figures = json.loads(done.stdout)
    assert figures["groups"] == 40 and figures["claim"]["claim_ms_median"] > 0
    assert [d["prefetch"] for d in figures["drain"]] == [1, 32]
    assert all(d["drained"] == 40 for d in figures["drain"]), figures["drain"]


def test_bench_cas_forms_runs_at_tiny_sizes(tmp_path: Path) -> None:
    """`bench/store/cas_forms.py` at tiny sizes on its own embedded server: before it times
    anything it checks that the pipeline form writes the document the store's filter form
    writes and that a stale one writes nothing (a failed check exits non-zero); then its
    section has a row per form."""
    out = tmp_path / "RESULTS.md"
    argv = [sys.executable, "-m", "bench.store.cas_forms", "--docs", "4", "--rounds", "1", "--out", str(out)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-6000:]
    text = out.read_text()
    assert "<!-- section cas-forms: begin -->" in text and "<!-- section cas-forms: end -->" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and ln.endswith("x |")]
    assert len(rows) == 3 and rows[0].endswith("| 1.00x |"), rows
