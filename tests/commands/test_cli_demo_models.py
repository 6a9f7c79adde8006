"""`harel-beanie demo --models DIR` runs a user's own `*.stm` models: executions of each
machine, driven with events their transitions accept, and the report the shop gets.

It used to refuse any folder without the shop's machines ("the demo needs the machines
['Order', 'Payment'] of models/ in ..."), where getting-started promised "your own *.stm
models"; and `--model` (a typo) was taken for `--models`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pymongo

from tests.commands.test_cli import one_line_error, run_cli

#: a three-state traffic light: timers move it on, a button press skips the red wait
LIGHT = """\
event Press {}

machine Light {
  initial Red
  state Red { timeout 30 }
  state Green { timeout 30 }
  state Yellow { timeout 5 }
  from Red to Green on Timeout
  from Red to Green on Press
  from Green to Yellow on Timeout
  from Yellow to Red on Timeout
}
"""

#: a code lock: a required context, declared events with fields, guarded transitions (on
#: the event's data, and on the context a wrong code counts into)
DOOR = """\
event Code { digits: string }
event Close {}

machine Door {
  context {
    owner: string
    tries: int = 0
  }
  initial Locked
  state Locked {}
  state Open {}
  final Retired success
  from Locked to Open on Code where digits == "1234"
  from Locked to Locked on Code where digits != "1234" set context.tries = context.tries + 1
  from Open to Retired on Close where context.tries > 0
  from Open to Locked on Close
}
"""

#: a fan-out over a field declared a string: no context fits it, so the demo skips it
BATCH = """\
import "light.stm" as l

machine Batch {
  context {
    items: string
  }
  initial Running
  state Running {
    invoke l.Light for item in items
  }
  final Done success
  from Running to Done
}
"""


#: a machine whose action raises on the event that reaches it
BOOM = """\
bind {
  explode = boom_actions.explode
}

event Go {}

machine Boom {
  initial Waiting
  state Waiting {}
  state Exploding { on enter explode }
  final Done success
  from Waiting to Exploding on Go
  from Exploding to Done
}
"""


def _models(folder: Path, **files: str) -> Path:
    folder.mkdir()
    for name, text in files.items():
        (folder / f"{name}.stm").write_text(text)
    return folder


def test_demo_runs_a_users_own_models(tmp_path: Path, mongo_url: str, db_name: str) -> None:
    models = _models(tmp_path / "mine", light=LIGHT, door=DOOR, batch=BATCH)
    proc = run_cli("demo", "--models", str(models), "-n", "8", "--url", mongo_url, "--db", db_name, cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert "the models in mine/" in out
    run_id, total = re.search(r"Run (demo-[0-9a-f]{6}): (\d+) executions", out).groups()  # type: ignore[union-attr]
    # the machine it cannot start is named, in one line, with harel's reason; the others run
    skipped = [line for line in out.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and skipped[0].startswith("  skipped Batch: the demo cannot start it"), skipped
    assert "'items' must be string" in skipped[0]
    table = out[out.index("How the executions ended") : out.index("Round trips")]
    rows = re.findall(r"^\s+(Light|Door)\s+(\d+)\s+(.+?)\s{2,}(yes|no\b.*?)\s*$", table, re.M)
    assert {r[0] for r in rows} == {"Light", "Door"}, table
    assert all(r[3] == "yes" for r in rows), table
    # the guarded way out was found: a wrong code, the right one, then Close
    assert any(r[0] == "Door" and r[2] == "Retired" for r in rows), table
    for text in ("events/s", "round trips/event", "Where the data lives", f"database   {db_name}"):
        assert text in out, text
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(mongo_url)
    try:
        executions = client[db_name].harel_executions
        mine = list(executions.find({"_id": {"$regex": f"^{run_id}-"}}, {"definition_id": 1, "status": 1}))
        assert len(mine) == int(total)
        assert {d["definition_id"] for d in mine} == {"Light", "Door"}
        # each was driven: events handled besides its Start (the ids of those it processed)
        handled = {d["_id"]: len(d.get("processed") or []) for d in executions.find({"_id": {"$regex": f"^{run_id}-"}})}
        assert all(n > 1 for n in handled.values()), handled
        assert not [d for d in mine if d["status"] in ("RUNNING", "PENDING", "FAILED")], mine
    finally:
        client.close()


def test_a_model_whose_action_fails_is_reported_not_crashed(tmp_path: Path, mongo_url: str, db_name: str) -> None:
    """An action of the user's raising ends its execution FAILED: the report says so, exit 1."""
    models = _models(tmp_path / "mine", boom=BOOM)
    (models / "boom_actions.py").write_text("def explode(ctx, event):\n    raise RuntimeError('boom')\n")
    proc = run_cli("demo", "--models", str(models), "-n", "2", "--url", mongo_url, "--db", db_name, cwd=tmp_path)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "failed:" not in proc.stderr  # harel logs the action's traceback; the demo itself did not fail
    assert re.search(r"^\s+Boom\s+2\s+.+no, expected no error", proc.stdout, re.M), proc.stdout


def test_a_mistyped_models_flag_is_refused(tmp_path: Path) -> None:
    """`--model` used to be taken for `--models` (argparse's abbreviations)."""
    proc = run_cli("demo", "--model", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "--model" in proc.stderr and "unrecognized" in proc.stderr, proc.stderr
    assert not (tmp_path / "harel-beanie-data").exists()


def test_models_that_do_not_load_are_refused_in_one_line_before_a_server_starts(tmp_path: Path) -> None:
    models = _models(tmp_path / "mine", broken="machine Broken {\n  initial Nowhere\n}\n")
    line = one_line_error(run_cli("demo", "--models", str(models), cwd=tmp_path))
    assert line.startswith("harel-beanie demo: --models: the models in ") and "do not load" in line, line
    assert not (tmp_path / "harel-beanie-data").exists()
