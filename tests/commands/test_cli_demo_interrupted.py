"""An interrupted `harel-beanie demo` does not break the next one in that folder.

The demo replays a week of shop time on a clock that starts a week back. A run stopped
midway used to leave queue groups, outbox entries and RUNNING executions stamped on its own
clock, ahead of the next run's: every later demo in that folder sat at "0/N done" and failed
with `DemoStalled ... (12, 0, 0, 0)`, naming no fix. Now the next run finds the interrupted
one, says in one line that it starts over, and completes; `DemoStalled` names the command.

Each case runs the real command, stops it at a point read from its own output (a phase of
the last, real-time batch, when its work is in flight), by Ctrl-C (SIGINT), SIGKILL of the
demo, or SIGKILL of its embedded server, then runs `harel-beanie demo` again there.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pymongo
import pytest

from harel_beanie.store.connect import mask_url
from tests.commands.test_cli import cli_env, one_line_error, run_cli

DATA = "harel-beanie-data"
#: a phase line of the last batch (the ones of the week before start "a week ago:")
LAST_BATCH = r"^  \w\w\w \d\d:\d\d  (?P<phase>.+?)\s+\d+/\d+ done"


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """The user's folder; whatever embedded server is left running on it is stopped after."""
    yield tmp_path
    try:
        pid = int(json.loads((tmp_path / DATA / "server.json").read_text())["pid"])
        os.killpg(pid, signal.SIGKILL)
    except (OSError, ValueError, KeyError):
        pass


def _interrupted(cwd: Path, phase: str, how: str) -> tuple[int, str]:
    """Run the demo in `cwd` until it prints the last batch's `phase` line, then stop it
    `how`; its exit status and output."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "harel_beanie", "demo", "-n", "60"],
        cwd=cwd,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert demo.stdout is not None
    seen = []
    try:
        for line in demo.stdout:
            seen.append(line)
            found = re.match(LAST_BATCH, line)
            if found and found.group("phase") == phase:
                break
        else:
            pytest.fail("the demo ended before the point to interrupt it:\n" + "".join(seen))
        if how == "SIGINT":
            demo.send_signal(signal.SIGINT)
        elif how == "SIGKILL demo":
            demo.kill()
        else:  # its embedded server, the `secantusd-py` child the handoff file names
            server = json.loads((cwd / DATA / "server.json").read_text())
            os.killpg(int(server["pid"]), signal.SIGKILL)
        rest, _ = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    return demo.returncode, "".join(seen) + rest


@pytest.mark.parametrize(
    "how, phase",
    [
        pytest.param("SIGINT", "cooling off, picking", id="sigint-cooling-off"),
        # a second kill of the demo, at another phase: the soak's (each case is a whole demo run)
        pytest.param("SIGKILL demo", "paying (retries on timers)", id="kill-demo-paying", marks=pytest.mark.soak),
        pytest.param("SIGKILL demo", "packing", id="kill-demo-packing"),
        pytest.param("SIGKILL server", "paying (retries on timers)", id="kill-server-paying"),
    ],
)
def test_the_next_demo_after_an_interrupted_one_starts_over_and_completes(folder: Path, how: str, phase: str) -> None:
    code, out = _interrupted(folder, phase, how)
    assert code != 0, out  # it was stopped midway, not finished
    if how == "SIGKILL server":  # it says what happened and what to run, in one line
        assert "DemoServerLost: the embedded server stopped answering mid-run" in out, out
        assert "run `harel-beanie demo` again" in out, out
    began = time.monotonic()
    again = run_cli("demo", "-n", "27", cwd=folder, timeout=240)
    took = time.monotonic() - began
    assert again.returncode == 0, (took, again.stdout, again.stderr)
    assert "Traceback" not in again.stderr
    # the one line saying what it did with the earlier run, then the run and its report
    said = [line for line in again.stdout.splitlines() if line.startswith("Starting over")]
    assert len(said) == 1, again.stdout
    assert re.match(r"Starting over: earlier run demo-[0-9a-f]{6} interrupted; dropped the demo's database", said[0])
    assert re.search(r"Run demo-[0-9a-f]{6}: \d+ executions", again.stdout)
    assert "no, expected" not in again.stdout
    assert "no executions from earlier runs: this is the first" in again.stdout
    if how != "SIGINT":
        return
    # and the run after a finished one keeps what it made (once: the other cases would repeat it)
    third = run_cli("demo", "-n", "12", cwd=folder, timeout=240)
    assert third.returncode == 0, (third.stdout, third.stderr)
    assert "Starting over" not in third.stdout
    assert "executions from earlier runs" in third.stdout and "; still there" in third.stdout


def test_on_a_given_server_it_asks_and_a_stall_names_the_command_that_fixes_it(
    folder: Path, mongo_url: str, db_name: str
) -> None:
    """On a server given by URL an interrupted run is not cleared unasked: the demo refuses
    in one line naming `--fresh`. Work it cannot move (here a queue group parked far ahead of
    its clock) ends in `DemoStalled` naming the same command, which then completes."""
    flags = ["--url", mongo_url, "--db", db_name]
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(mongo_url)
    try:
        # the record an interrupted run leaves: started, never finished
        client[db_name].harel_hb_demo_runs.insert_one({"_id": "demo-0a0b0c", "started_at": 0.0, "finished_at": None})
        refused = run_cli("demo", "-n", "1", *flags, cwd=folder)
        line = one_line_error(refused)
        assert "demo-0a0b0c" in line and "did not finish" in line, line
        assert f"--db {db_name} --fresh`" in line, line

        client[db_name].harel_hb_demo_runs.delete_many({})
        client[db_name].harel_hb_queues.insert_one(
            {"_id": "someone-else-1", "pending": 1, "qn": 1, "q": [], "available_at": 4e9, "part": 0, "priority": 0}
        )
        stalled = run_cli("demo", "-n", "1", *flags, cwd=folder, timeout=240)
        assert stalled.returncode == 1, (stalled.stdout, stalled.stderr)
        named = re.search(r"DemoStalled: .*start over with `harel-beanie demo (.+)`", stalled.stderr)
        assert named, stalled.stderr
        given = named.group(1).split()
        assert given == ["--url", mask_url(mongo_url), "--db", db_name, "--fresh"], given
        again = run_cli("demo", "-n", "1", *flags, "--fresh", cwd=folder, timeout=240)
        assert again.returncode == 0, (again.stdout, again.stderr)
        assert re.search(r"^Starting over \(--fresh\): dropped the demo's database", again.stdout, re.M)
    finally:
        client.close()
