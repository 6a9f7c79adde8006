"""`harel-beanie demo` runs the shop models to completion and reports them; with no URL it
keeps its data in the embedded server's folder, so a second run finds the first run's."""

from __future__ import annotations

import re

import pymongo

from tests.test_cli import run_cli


def test_demo_runs_the_models_on_a_given_server_and_summarises(tmp_path, mongo_url, db_name):
    proc = run_cli("demo", "-n", "27", "--url", mongo_url, "--db", db_name, cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, (out, proc.stderr)
    assert "Traceback" not in proc.stderr
    run_id = re.search(r"Run (demo-[0-9a-f]{6}): (\d+) executions", out)
    assert run_id, out
    # the per-model table, the endings each as the model says, the round trips, the data
    for text in ("Order", "pay.Payment", "pick.PickLine", "events/s", "round trips/event",
                 "How the orders and payments ended", "Round trips", "the transport",
                 "Where the data lives", f"database   {db_name}", "harel_executions"):  # fmt: skip
        assert text in out, (text, out)
    assert "no, expected" not in out
    for ending in ("Completed", "PaymentFailed", "Unfulfilled", "Cancelled", "Lost", "GaveUp"):
        assert ending in out
    assert "embedded" not in out  # it used the URL it was given
    # what it reports is what the store holds
    client: pymongo.MongoClient = pymongo.MongoClient(mongo_url)
    try:
        mine = {"_id": {"$regex": f"^{run_id.group(1)}-"}}
        assert client[db_name].harel_executions.count_documents(mine) == int(run_id.group(2))
        assert client[db_name].harel_executions.count_documents({**mine, "status": "RUNNING"}) == 0
        assert client[db_name].harel_transport_messages.count_documents({}) == 0
    finally:
        client.close()


def test_a_second_demo_run_finds_the_first_runs_executions(tmp_path):
    """No URL: the embedded server, data in ./harel-beanie-data, stopped on exit."""
    first = run_cli("demo", "-n", "12", cwd=tmp_path)
    assert first.returncode == 0, (first.stdout, first.stderr)
    assert "No MONGODB_URL set: started the embedded MongoDB server" in first.stdout
    assert "no executions from earlier runs" in first.stdout
    assert "embedded SecantusDB" in first.stdout and "Stopping the embedded server" in first.stdout
    run1, n1 = re.search(r"Run (demo-[0-9a-f]{6}): (\d+) executions", first.stdout).groups()  # type: ignore[union-attr]
    assert (tmp_path / "harel-beanie-data" / "db").is_dir()
    assert not (tmp_path / "harel-beanie-data" / "server.json").exists()

    second = run_cli("demo", "-n", "12", cwd=tmp_path)
    assert second.returncode == 0, (second.stdout, second.stderr)
    run2 = re.search(r"Run (demo-[0-9a-f]{6})", second.stdout).group(1)  # type: ignore[union-attr]
    assert run2 != run1
    assert f"found {n1} executions from earlier runs ({run1}); still there" in second.stdout
