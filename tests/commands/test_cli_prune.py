"""`harel-beanie prune` refuses what it could misread, through the real command line.

`prune --finished-before 30` once meant 30 seconds: a user who meant 30 days removed nearly
every finished execution. An age now carries its unit; on a terminal the command counts what
it would remove and asks; with no terminal (cron) it removes only with `--yes`. And a flag is
taken only as typed: argparse's abbreviations once read `--model` as `--models`.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from harel.engine.execution import Execution, Status

from tests.commands.test_cli import cli_env, one_line_error, run_cli


def _seed(client: Any, db_name: str, n: int) -> Any:
    """`n` executions DONE 40 days ago, as harel's runner leaves them."""
    coll = client[db_name].harel_executions
    for k in range(n):
        exe = Execution(id=f"p-{k}", definition_id="Order", status=Status.DONE, finished_at=time.time() - 40 * 86400)
        coll.insert_one(
            {
                "_id": exe.id,
                "definition_id": "Order",
                "version": 1,
                "data": exe.model_dump_json(),
                "status": "DONE",
                "finished_at": exe.finished_at,
                "parent_id": None,
            }
        )
    return coll


@pytest.mark.parametrize(
    "args",
    [
        ["--finished-before", "30"],
        ["--finished-before", "30", "--dry-run"],
        ["--finished-before", "1.5"],
    ],
)
def test_an_age_without_its_unit_is_refused_naming_the_units(tmp_path: Path, mongo_url: str, args) -> None:
    """Refused before the server is reached: exit 2, one line naming the flag and the units."""
    line = one_line_error(run_cli("prune", "--url", mongo_url, *args, "--yes", cwd=tmp_path))
    flag, number = args[0], args[1]
    assert f"{flag} {number} has no unit" in line, line
    assert "d (days)" in line and "h (hours)" in line and "s (seconds)" in line and "w (weeks)" in line


def test_with_no_terminal_prune_removes_only_with_yes(tmp_path: Path, mongo_url: str, client, db_name) -> None:
    """A cron job without `--yes` removes nothing and says in one line what to pass; with
    `--yes` it removes; `--dry-run` needs no `--yes`."""
    coll = _seed(client, db_name, 4)
    args = ("prune", "--url", mongo_url, "--db", db_name, "--finished-before", "30d")
    line = one_line_error(run_cli(*args, cwd=tmp_path))  # stdin is not a terminal here
    assert "--yes" in line and "no terminal" in line, line
    assert coll.count_documents({}) == 4
    dry = run_cli(*args, "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and "4 would be removed of 4" in dry.stdout, dry.stdout + dry.stderr
    done = run_cli(*args, "--yes", cwd=tmp_path)
    assert done.returncode == 0 and "4 removed of 4" in done.stdout, done.stdout + done.stderr
    assert coll.count_documents({}) == 0


def _on_a_terminal(args: list[str], cwd: Path, answer: str) -> tuple[int, str, str]:
    """Run the command with a pseudo-terminal as its stdin; answer its question once it asks.
    Its exit code, stdout and stderr (the question is on stderr)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "harel_beanie", *args],
        cwd=cwd,
        env=cli_env(),
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    os.close(follower)
    assert proc.stderr is not None and proc.stdout is not None
    err = b""
    deadline = time.monotonic() + 120
    try:
        while b"[y/N]" not in err:  # the question, before anything is removed
            assert time.monotonic() < deadline, err
            ready, _, _ = select.select([proc.stderr], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stderr.fileno(), 4096)
                assert chunk, f"exited without asking: {err!r} {proc.stdout.read()!r}"
                err += chunk
        os.write(leader, answer.encode() + b"\n")
        out, rest = proc.communicate(timeout=120)
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out.decode(), (err + rest).decode()


@pytest.mark.parametrize("answer", ["n", "y"])
def test_on_a_terminal_prune_counts_then_asks(tmp_path: Path, mongo_url: str, client, db_name, answer) -> None:
    """The question names how many it will remove of how many; a no removes nothing (exit 1,
    one line), a yes removes them."""
    coll = _seed(client, db_name, 5)
    args = ["prune", "--url", mongo_url, "--db", db_name, "--finished-before", "30d"]
    code, out, err = _on_a_terminal(args, tmp_path, answer)
    assert "Remove 5 of 5 finished execution(s)? [y/N]" in err, err
    if answer == "n":
        assert code == 1 and "nothing removed (not confirmed)" in err, (code, out, err)
        assert coll.count_documents({}) == 5
    else:
        assert code == 0 and "5 removed of 5" in out, (code, out, err)
        assert coll.count_documents({}) == 0


@pytest.mark.parametrize(
    "args,typed",
    [
        (["demo", "--model", "models"], "--model"),  # --models
        (["prune", "--finished-before", "30d", "--dry"], "--dry"),  # --dry-run
        (["status", "--stuck", "60"], "--stuck"),  # --stuck-after
        (["worker", "--def", "models"], "--def"),  # --definitions
    ],
)
def test_a_flag_is_taken_only_as_typed(tmp_path: Path, args, typed) -> None:
    """An abbreviation of a flag is refused (exit 2, one line naming it), never taken as the flag."""
    line = one_line_error(run_cli(*args, cwd=tmp_path, timeout=60))
    assert f"unrecognized arguments: {typed}" in line, line
