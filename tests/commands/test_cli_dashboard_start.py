"""`harel-beanie dashboard` refuses as every other command does, before it prints a link.

With an unreachable server it once printed a token link that would never work, then a
25-line uvicorn traceback, exit 3 after 12.8 s; with its port taken, a link to another
process's port, then `address already in use`, exit 3. Both are now one line, exit 2, and
no link.
"""

from __future__ import annotations

import socket
from pathlib import Path

from harel_beanie.deploy.embedded import free_port
from tests.commands.test_cli import one_line_error, run_cli


def test_an_unreachable_server_is_one_line_and_no_link(tmp_path: Path) -> None:
    dead = f"mongodb://127.0.0.1:{free_port()}"
    proc = run_cli(
        "dashboard", "--url", dead, "--port", str(free_port()), "--connect-attempts", "2", cwd=tmp_path, timeout=60
    )
    line = one_line_error(proc)
    assert line.startswith("harel-beanie dashboard: ") and "127.0.0.1" in line, line
    assert "token=" not in proc.stdout and "open http" not in proc.stdout, proc.stdout


def test_a_port_in_use_is_one_line_and_no_link(tmp_path: Path, mongo_url: str, db_name: str, client) -> None:
    client[db_name].harel_executions.insert_one({"_id": "x"})  # a database with data: only the port is wrong
    with socket.socket() as other:  # another process's server on the port
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        proc = run_cli("dashboard", "--url", mongo_url, "--db", db_name, "--port", str(taken), cwd=tmp_path, timeout=60)
    line = one_line_error(proc)
    assert f"--port {taken} is in use on 127.0.0.1: pass --port N" in line, line
    assert "token=" not in proc.stdout and "open http" not in proc.stdout, proc.stdout
