"""`harel-beanie server` as a user runs it: a child process that prints the `MONGODB_URL` to
export, serves pymongo and the other commands on that URL until SIGTERM, exits 0 having
stopped its server, and refuses a second server on the same folder in one line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pymongo

from harel_beanie.deploy.embedded import free_port
from tests.commands.test_cli import cli_env, one_line_error, run_cli


def _start(cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "harel_beanie", "server", *args],
        cwd=cwd,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _exported_url(proc: subprocess.Popen[str]) -> str:
    """The URL of the `export MONGODB_URL=...` line it prints once it serves."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.strip().startswith("export MONGODB_URL="):
            return line.strip().split("=", 1)[1]
    raise AssertionError(f"no export line; stdout {seen}, stderr {proc.stderr.read() if proc.stderr else ''}")


def test_the_server_serves_until_sigterm_and_refuses_a_second_on_its_folder(tmp_path):
    port = free_port()
    proc = _start(tmp_path, "--port", str(port))
    try:
        url = _exported_url(proc)
        assert url == f"mongodb://127.0.0.1:{port}"
        data = tmp_path / "harel-beanie-data"
        handoff = json.loads((data / "server.json").read_text())
        assert handoff["command"] == "server" and handoff["port"] == port

        with pymongo.MongoClient(url, serverSelectionTimeoutMS=5000) as client:  # what a user's code does
            client.app.things.insert_one({"_id": "a", "n": 1})
            assert client.app.things.find_one({"_id": "a"}) == {"_id": "a", "n": 1}

        # a second server on the folder: refused in one line naming the running one's URL
        line = one_line_error(run_cli("server", "--port", str(free_port()), cwd=tmp_path, timeout=60))
        assert f"already runs on harel-beanie-data/ (pid {handoff['pid']}" in line, line
        assert f"export MONGODB_URL={url}" in line and "--data DIR" in line
        # the other commands in the folder use it, and leave it running
        joined = run_cli("status", "--json", cwd=tmp_path)
        assert joined.returncode == 0, joined.stderr
        assert json.loads(joined.stdout)["where"]["url"] == url
        assert f"using the server `harel-beanie server` runs in this folder: {url}" in joined.stderr.splitlines()[0]
        assert proc.poll() is None

        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out, err)
        assert "Stopping the embedded server" in out
        assert not (data / "server.json").exists()
        with pymongo.MongoClient(url, serverSelectionTimeoutMS=500) as client:  # stopped with it
            try:
                client.admin.command("ping")
                raise AssertionError("the embedded server still answers after SIGTERM")
            except pymongo.errors.ServerSelectionTimeoutError:
                pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_port_in_use_is_refused_before_a_folder_is_made(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        line = one_line_error(run_cli("server", "--port", str(taken), cwd=tmp_path, timeout=60))
    assert f"--port {taken} is in use" in line
    assert not (tmp_path / "harel-beanie-data").exists()


def test_every_command_in_its_folder_uses_the_server(tmp_path):
    """Its banner says "commands run in this folder use it too": the worker and `migrate
    status` once refused there with "no MongoDB URL". With no URL set, each command names the
    server it uses in its first line, and works on it: the worker starts (its ready line),
    `migrate status`, `status` and `prune --dry-run` answer."""
    from harel_beanie.deploy.loader import default_models_dir

    port = free_port()
    proc = _start(tmp_path, "--port", str(port))
    try:
        url = _exported_url(proc)
        first = f"using the server `harel-beanie server` runs in this folder: {url}"
        for args in (["migrate", "status"], ["status"], ["prune", "--finished-before", "30d", "--dry-run"]):
            done = run_cli(*args, cwd=tmp_path, timeout=120)
            assert done.returncode == 0, (args, done.stdout, done.stderr)
            assert done.stderr.splitlines()[0].startswith(first), (args, done.stderr)
        # the demo too, and its report says the server is left running, its commands need no --url
        demo = run_cli("demo", "-n", "12", cwd=tmp_path, timeout=300)
        assert demo.returncode == 0, (demo.stdout[-3000:], demo.stderr[-3000:])
        said = " ".join(demo.stdout.split())  # the report's lines as rich wrapped them, joined
        assert "`harel-beanie server` runs here" in said and "left running" in said, demo.stdout
        assert "stopped on exit" not in said and " --url " not in said, demo.stdout
        worker = subprocess.Popen(
            [sys.executable, "-m", "harel_beanie", "worker", "--definitions", str(default_models_dir())],
            cwd=tmp_path,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert worker.stdout is not None and worker.stderr is not None
            ready = worker.stdout.readline()
            assert " ready: " in ready and url in ready, (ready, worker.stderr.read() if worker.poll() else "")
            worker.send_signal(signal.SIGTERM)
            out, err = worker.communicate(timeout=60)
            assert worker.returncode == 0, (out, err)
            assert err.splitlines()[0].startswith(first), err
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        assert proc.poll() is None  # the server outlives the commands that used it
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
