"""The per-event cost table of the benchmarks (bench/common/kinds.py, bench/common/cost.py,
bench/stack/cost.py): every command's kind read from its shape, the table's sums, and a tiny
run of both stacks on the embedded server whose commands per event are checked where they are
fixed by the code (a handled event is one load and one commit; this transport acks in one
command and publishes in one; harel's transport publishes in three).

The captured commands (golden/command_kinds.json) are one of each shape the benchmark's stacks
sent in a run (harel's store and transport, this package's store and transport, and the
`harel-beanie worker` process on each transport, folding, sampling and leasing partitions),
with the kind each was read as when captured, checked by hand then; values trimmed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.common.cost import Cost, Part, table
from bench.common.kinds import ALL, KINDS, OBSERVER, classify

ROOT = Path(__file__).resolve().parents[2]
CAPTURED = json.loads((Path(__file__).resolve().parent / "golden" / "command_kinds.json").read_text())


def test_every_captured_command_is_read_as_the_kind_it_was_captured_as() -> None:
    wrong = [(r["kind"], classify(r["name"], r["command"]), r["command"]) for r in CAPTURED]
    assert [w for w in wrong if w[0] != w[1]] == []
    assert set(KINDS) <= {r["kind"] for r in CAPTURED}  # every kind of work met in a real run


@pytest.mark.parametrize(
    "name, command, kind",
    [
        # harel's store, traced: the trace step's sequence, then the step pushed
        ("findAndModify", {"findAndModify": "p_counters", "query": {"_id": "trace:e1"}, "update": {}}, "commit"),
        (
            "update",
            {"update": "p_executions", "updates": [{"q": {"_id": "e1"}, "u": {"$push": {"trace": {}}}}]},
            "commit",
        ),
        # harel's store: a fired timer removed, due timers read
        (
            "update",
            {"update": "p_executions", "updates": [{"q": {"_id": "e1", "timers.a": 1.0}, "u": {"$unset": {}}}]},
            "sweep",
        ),
        ("find", {"find": "p_executions", "filter": {"spawns": {"$exists": True, "$ne": []}}}, "relay"),
        # this transport: a nack puts the group back (the token in the filter, as an ack's)
        ("update", {"update": "p_hb_queues", "updates": [{"q": {"_id": "g", "token": "t"}, "u": {}}]}, "ack"),
        # the benchmark's own read, whatever it addresses
        ("aggregate", {"aggregate": "p_executions", "pipeline": [], "comment": OBSERVER}, "observer"),
        ("ping", {"ping": 1}, "other"),
        ("find", {"find": "unknown", "filter": {}}, "other"),
    ],
)
def test_shapes_the_runs_did_not_send(name: str, command: dict[str, Any], kind: str) -> None:
    assert classify(name, command) == kind


def test_the_server_cpu_is_shared_by_wire_time_within_each_part() -> None:
    """Each part's CPU goes to its kinds in proportion to their wire time; the kinds add up to
    the total; the floor is one commit and one publish at this stack's CPU per command."""
    cost = Cost(events=10)
    cost.parts["worker"].add({"commit": 10, "claim": 20}, {"commit": 0.3, "claim": 0.1}, 0.2)
    cost.parts["producer"].add({"publish": 10}, {"publish": 0.5}, 0.05)
    assert cost.cpu_ms("commit") == pytest.approx(15.0) and cost.cpu_ms("claim") == pytest.approx(5.0)
    assert cost.cpu_ms("publish") == pytest.approx(5.0) and cost.total_cpu_ms() == pytest.approx(25.0)
    assert math.fsum(cost.cpu_ms(k) or 0.0 for k in ALL) == pytest.approx(25.0)
    assert cost.floor_ms() == pytest.approx(15.0 + 5.0)  # one commit command and one publish, each 1 per event here
    assert cost.commands("claim", "worker") == 2.0 and cost.commands("claim", "producer") == 0.0
    # read once over both parts (worker processes of their own): shared over both parts' wire time
    whole = Cost(events=10, server_cpu=0.09)
    whole.parts["worker"].add({"commit": 10}, {"commit": 0.2}, None)
    whole.parts["producer"].add({"publish": 10}, {"publish": 0.1}, None)
    assert whole.cpu_ms("commit") == pytest.approx(6.0) and whole.cpu_ms("publish") == pytest.approx(3.0)
    # a part that sent commands and whose CPU is unknown leaves the CPU unknown, not low
    blind = Cost(events=10, parts={"worker": Part({"commit": 10}, {"commit": 0.1}, None), "producer": Part()})
    assert blind.cpu_ms("commit") is None and blind.total_cpu_ms() is None
    rows = table([("a", cost), ("b", blind)])
    assert [r.split("|")[1].strip() for r in rows[2:]] == [*KINDS, "**all**", "*floor: one commit, one publish*"]
    assert rows[-2].split("|")[2:6] == [" 3.00 ", " 1.00 ", " 25.00 ", " 100% "]


def test_a_tiny_run_of_both_stacks_counts_what_the_code_fixes() -> None:
    """Both stacks, concurrency 1, ten events (two Parcels) on a fresh embedded server. Fixed
    by the code, so exact: a handled event is one load and one commit on either store; this
    transport's ack is one command and its publish one, harel's ack four (five for a group's
    last message: 21 per Parcel) and its publish three; the producer loads the execution for
    each of a Parcel's four sends, and this store's create is one insert and one relay mark.
    Claims are not fixed (a worker that finds nothing claims again), only bounded below."""
    argv = [sys.executable, "-m", "bench.stack.cost", "--events", "10", "--concurrency", "1", "--json"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    figures = json.loads(done.stdout)
    assert set(figures) == {"stack-harel 1", "stack-beanie 1"}
    for name, f in figures.items():
        k = f["kinds"]
        assert f["events"] == 10, name
        assert (k["load"]["worker"], k["commit"]["worker"]) == (1.0, 1.0), name
        assert k["load"]["producer"] == 0.8, name
        assert k["claim"]["worker"] >= 2.0 and k["claim"]["producer"] == 0.0, name
        assert k["publish"]["worker"] == 0.0, name  # Parcel's steps emit nothing: only the producer publishes
        assert f["total_cpu_ms"] > 0 and f["floor_ms"] > 0, name  # the embedded server's CPU, read here
        assert math.fsum(v["cpu_ms"] for v in k.values()) == pytest.approx(f["total_cpu_ms"]), name
    ours, harel = figures["stack-beanie 1"]["kinds"], figures["stack-harel 1"]["kinds"]
    assert (ours["ack"]["worker"], ours["publish"]["producer"]) == (1.0, 1.0)
    assert (ours["commit"]["producer"], ours["relay"]["producer"]) == (0.2, 0.2)
    assert (harel["ack"]["worker"], harel["publish"]["producer"]) == (4.2, 3.0)
