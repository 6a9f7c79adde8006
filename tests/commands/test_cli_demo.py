"""`harel-beanie demo` runs the shop models to completion and reports them; with no URL it
keeps its data in the embedded server's folder, so a second run finds the first run's."""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path
from typing import Any

import pymongo

from harel_beanie.store.connect import mask_url
from tests.commands.test_cli import run_cli


def test_demo_runs_the_models_on_a_given_server_and_summarises(tmp_path, mongo_url, db_name):
    began = time.time()
    proc = run_cli("demo", "-n", "27", "--url", mongo_url, "--db", db_name, cwd=tmp_path)
    out = proc.stdout
    # the whole report on failure: which scenario ended otherwise is in its endings table
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    run_id = re.search(r"Run (demo-[0-9a-f]{6}): (\d+) executions", out)
    assert run_id, out
    # the per-model table, the endings each as the model says, the round trips, the data
    for text in (
        "Order",
        "pay.Payment",
        "pick.PickLine",
        "events/s",
        "round trips/event",
        "How the orders and payments ended",
        "Round trips",
        "the transport",
        "Where the data lives",
        f"database   {db_name}",
        "harel_executions",
    ):
        assert text in out, (text, out)
    assert "no, expected" not in out
    for ending in ("Completed", "PaymentFailed", "Unfulfilled", "Cancelled", "Lost", "GaveUp"):
        assert ending in out
    _reads_in_80_columns_with_a_line_a_phase(out)
    _keeps_status_and_outcome_apart(out)
    assert "embedded" not in out  # it used the URL it was given
    _names_the_views(out, tmp_path, f" --url {shlex.quote(mask_url(mongo_url))} --db {db_name}")
    # what it reports is what the store holds
    client: pymongo.MongoClient = pymongo.MongoClient(mongo_url)
    try:
        mine = {"_id": {"$regex": f"^{run_id.group(1)}-"}}
        assert client[db_name].harel_executions.count_documents(mine) == int(run_id.group(2))
        assert client[db_name].harel_executions.count_documents({**mine, "status": "RUNNING"}) == 0
        assert client[db_name].harel_transport_messages.count_documents({}) == 0
        _ends_now(client[db_name], run_id.group(1), began)
    finally:
        client.close()


def _reads_in_80_columns_with_a_line_a_phase(out: str) -> None:
    """Piped, as here: a line for each phase as it starts (no bar is drawn; it used to print
    nothing until the end), and every line but the commands to copy fits 80 columns (the
    tables used to be 106 wide and wrapped on an 80-column terminal)."""
    phases = [
        m.group(1)
        for m in (re.fullmatch(r"  \w{3} \d\d:\d\d  (.+?)\s+\d+/\d+ done", line) for line in out.splitlines())
        if m
    ]
    for phase in ("a week ago: creating orders", "a week later: lost parcels", "creating orders", "packing", "done"):
        assert phase in phases, (phase, phases)
    report = out[: out.index("Look at them")]
    wide = [line for line in report.splitlines() if len(line) > 80]
    assert not wide, wide


def _keeps_status_and_outcome_apart(out: str) -> None:
    """An execution's status (DONE, FAILED, ...) and its outcome (success, failed, ...) in
    columns of their own, with the difference said: the report used to print "Order 24
    failed" where `status` and the dashboard showed every execution DONE."""
    table = out[out.index("Status and outcome, by model") : out.index("How the orders and payments ended")]
    order = next(line for line in table.splitlines() if line.strip().startswith("Order "))
    status, outcome = re.match(r"\s*Order\s+(\d+ DONE)\s+(.*\S)\s*$", order).groups()  # type: ignore[union-attr]
    assert "failed" in outcome and "success" in outcome, order
    assert "an outcome failed is a DONE execution, not a FAILED one" in " ".join(table.split())


def _ends_now(db: Any, run_id: str, began: float) -> None:
    """The run's clock ends when it started: every execution but a lost parcel's order's
    children (finished a week back) was last written in the hour before, none later than now,
    and the dashboard's last-hour charts have a sample for every minute of that hour (the
    demo takes them at its clock's minutes). It used to end 1 to 8 days back: the charts and a
    search of the last hour found nothing after a fresh run."""
    now = time.time()
    docs = list(db.harel_executions.find({"_id": {"$regex": f"^{run_id}-"}}, {"updated_at": 1}))
    recent = [d for d in docs if d["updated_at"] >= began - 3600]
    assert all(d["updated_at"] <= now for d in docs)
    assert len(recent) >= 0.8 * len(docs), (len(recent), len(docs))
    hour = db.harel_hb_samples.count_documents({"_id": {"$gte": now - 3600, "$lte": now}})
    assert hour >= 59, hour


def _names_the_views(out: str, cwd: Path, flags: str) -> None:
    """The closing lines, as a new user reads them in the empty folder the demo ran in. They
    used to end with `monitor --definitions models`, naming a folder that is not there (the
    models ship in the package), without the `tui` extra the monitor needs, and without the
    dashboard. Now the dashboard comes first, with its extra; the monitor gets a definitions
    path that exists from here, and its extra."""
    closing = [line.strip() for line in out[out.index("Look at them") :].splitlines()[1:]]
    commands = {}  # each command named, without the way this machine runs harel-beanie, and its note
    for line, note in zip(closing, closing[1:]):
        found = re.match(r".*?harel[-_]beanie ((dashboard|status|monitor)\b.*)", line)
        if found:
            commands[found.group(2)] = (found.group(1), note)
    assert list(commands) == ["dashboard", "status", "monitor"], closing
    dashboard, note = commands["dashboard"]
    assert dashboard == f"dashboard{flags}"  # the shop models are the dashboard's own default
    assert "pip install 'harel-beanie[dashboard]'" in note
    monitor, note = commands["monitor"]
    named = re.fullmatch(rf"monitor{re.escape(flags)} --definitions (\S+)", monitor)
    assert named, monitor
    definitions = cwd / named.group(1)  # an absolute path stays itself
    assert definitions.is_dir() and (definitions / "order.stm").is_file(), definitions
    assert "pip install 'harel-beanie[tui]'" in note
    assert not (cwd / "models").exists()


def test_a_second_demo_run_finds_the_first_runs_executions(tmp_path):
    """No URL: the embedded server, data in ./harel-beanie-data, stopped on exit."""
    first = run_cli("demo", "-n", "12", cwd=tmp_path)
    assert first.returncode == 0, (first.stdout, first.stderr)
    assert "No MONGODB_URL set: started the embedded MongoDB server" in first.stdout
    assert "no executions from earlier runs" in first.stdout
    assert "embedded SecantusDB" in first.stdout and "Stopping the embedded server" in first.stdout
    run1, n1 = re.search(r"Run (demo-[0-9a-f]{6}): (\d+) executions", first.stdout).groups()  # type: ignore[union-attr]
    assert (tmp_path / "harel-beanie-data" / "db").is_dir()
    _names_the_views(first.stdout, tmp_path, "")  # the embedded server and the default database: no flags
    assert not (tmp_path / "harel-beanie-data" / "server.json").exists()

    second = run_cli("demo", "-n", "12", cwd=tmp_path)
    assert second.returncode == 0, (second.stdout, second.stderr)
    run2 = re.search(r"Run (demo-[0-9a-f]{6})", second.stdout).group(1)  # type: ignore[union-attr]
    assert run2 != run1
    assert f"found {n1} executions from earlier runs ({run1}); still there" in second.stdout
