"""The pip user's path: a wheel built from the project gives a project of the user's own (an
empty folder, no checkout around) everything the README's quick start needs. The quick start as
written, on the embedded server: `harel-beanie demo` runs the shop models shipped in the
package, `harel-beanie dashboard` serves its pages (the demo's executions listed, the charts,
an order's statechart drawn from the packaged models), its templates and static files (the
vendored mermaid and its licence) from the package, `status` and `prune` answer. On a server
named by URL: the demo, `status`, `prune` with an archive, `migrate` adopting a database
harel's own MongoStore wrote, `migrate-transport`. The sdist carries the tests, the models and
the migrations.

The default run installs the built wheel alone into a folder of its own and runs it with
site-packages' dependencies but not this checkout (`python -S`, so the checkout's editable
install is never seen; the test checks which `harel_beanie` is imported); the soak installs
the wheel with its extras into a fresh virtualenv, its dependencies from the index.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import sysconfig
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pymongo
import pytest
from harel.engine.execution import Execution, Status
from harel.engine.store import MongoStore as HarelMongoStore

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheel and the sdist, built from this checkout as a release would be."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-q", "-w", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return {"wheel": next(out.glob("*.whl")), "sdist": next(out.glob("*.tar.gz"))}


def test_the_wheel_and_the_sdist_carry_what_a_user_needs(dist: dict[str, Path]) -> None:
    names = set(zipfile.ZipFile(dist["wheel"]).namelist())
    for needed in (
        "harel_beanie/py.typed",
        "harel_beanie/demo/shop_models/order.stm",
        "harel_beanie/demo/shop_models/shop_actions.py",
        "harel_beanie/dashboard/templates/execution.html",
        "harel_beanie/dashboard/static/dashboard.js",
        "harel_beanie/dashboard/static/mermaid.min.js",
        "harel_beanie/dashboard/static/mermaid.LICENSE",
        # what Beanie's CLI is given (docs/switching.md): a pip user has no clone
        "harel_beanie/migrate/beanie_migrations/0001_adopt_harel_mongostore.py",
        "harel_beanie/migrate/beanie_migrations/0003_partitions.py",
    ):
        assert needed in names, needed
    with tarfile.open(dist["sdist"]) as sdist:
        inside = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    for needed in (
        "tests/conftest.py",
        "migrations/0001_adopt_harel_mongostore.py",
        "src/harel_beanie/demo/shop_models/payment.stm",
        "Makefile",
        "pyproject.toml",
    ):
        assert needed in inside, needed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _runner(wheel: Path, home: Path) -> Any:
    """`harel-beanie ...` from the wheel alone: installed into a folder of its own, run from an
    empty folder with the dependencies' site-packages and not this checkout."""
    target = home / "installed"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    project = home / "my-project"
    project.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), sysconfig.get_paths()["purelib"]])}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # secantusd-py

    def run(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-S", "-m", "harel_beanie", *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=kw.pop("timeout", 300),
            **kw,
        )

    run.project, run.env, run.target = project, env, target  # type: ignore[attr-defined]
    return run


class _Dashboard:
    """`harel-beanie dashboard` of an installed package, as a child process on a free port, with
    `get(path)` reading a page as a script would (the bearer token)."""

    TOKEN = "pip-token"

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [*command, "dashboard", "--port", str(self.port), "--token", self.TOKEN],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def __enter__(self) -> "_Dashboard":
        for _ in range(300):  # bounded: 60 s (the embedded server starts first)
            try:
                urllib.request.urlopen(f"{self.base}/static/dashboard.css", timeout=1)
            except urllib.error.HTTPError:
                return self  # it answers (401 without the token)
            except OSError:
                assert self.proc.poll() is None, self.proc.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
                time.sleep(0.2)
        raise AssertionError("the dashboard did not answer within 60 s")

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)

    def get(self, path: str) -> str:
        request = urllib.request.Request(self.base + path, headers={"Authorization": f"Bearer {self.TOKEN}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return str(response.read().decode())

    def shows_the_demo(self) -> None:
        """The front page lists the demo's executions and draws its charts; an order's page
        carries its statechart, drawn from the shop models in the package; mermaid is served."""
        front = self.get("/")
        assert "Executions" in front and "/static/dashboard.css" in front and 'id="charts"' in front
        rows = json.loads(self.get("/api/executions?definition=Order&limit=5"))["rows"]
        assert rows and all(r["id"].startswith("demo-") for r in rows), rows
        assert f'data-id="{rows[0]["id"]}"' in self.get("/?definition=Order&limit=5")
        assert len(json.loads(self.get("/api/charts"))["series"]) == 6
        assert len(self.get("/static/mermaid.min.js")) > 1_000_000
        assert "MIT" in self.get("/static/mermaid.LICENSE")
        page = self.get(f"/execution?id={urllib.parse.quote(rows[0]['id'], safe='')}")
        assert 'id="statechart-source"' in page and "stateDiagram-v2" in page


def test_the_quick_start_runs_from_the_wheel_alone(dist: dict[str, Path], tmp_path: Path, mongo_url: str) -> None:
    run = _runner(dist["wheel"], tmp_path)
    imported = subprocess.run(
        [sys.executable, "-S", "-c", "import harel_beanie; print(harel_beanie.__file__)"],
        cwd=run.project,
        env=run.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert Path(imported.stdout.strip()).is_relative_to(run.target), imported  # the wheel's, not this checkout
    command = [sys.executable, "-S", "-m", "harel_beanie"]

    # the README's quick start as written: no URL, the embedded server keeping ./harel-beanie-data
    demo = run("demo", "-n", "12")
    assert demo.returncode == 0 and "Run demo-" in demo.stdout, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert (run.project / "harel-beanie-data").is_dir()
    with _Dashboard(command, run.project, run.env) as dashboard:
        dashboard.shows_the_demo()
    status = run("status")
    assert status.returncode == 0 and "Order" in status.stdout, status.stderr[-2000:]
    dry = run("prune", "--finished-before", "1d", "--dry-run")
    assert dry.returncode == 0 and "would be removed" in dry.stdout, dry.stdout + dry.stderr[-2000:]

    # on a server named by URL: the same commands, and the migrations adopting a database that
    # harel's own MongoStore wrote
    db = "hbt_pip_" + uuid.uuid4().hex[:8]
    url = ["--url", mongo_url, "--db", db]
    try:
        demo = run("demo", "-n", "12", *url)
        assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
        assert "Run demo-" in demo.stdout and "Order" in demo.stdout
        for args in (["status"], ["migrate", "status"], ["migrate-transport", "status"]):
            done = run(*args, *url)
            assert done.returncode == 0, (args, done.stderr[-2000:])
        pruned = run(
            "prune", "--yes", "--finished-before", "1s", "--archive", "pruned.jsonl", *url
        )  # the demo's last hour ends when it started
        assert pruned.returncode == 0 and " removed of " in pruned.stdout, pruned.stdout + pruned.stderr[-2000:]
        assert (run.project / "pruned.jsonl").stat().st_size > 0
        HarelMongoStore(pymongo.MongoClient(mongo_url), db + "_harel").save(
            Execution(id="legacy-1", definition_id="Order", status=Status.RUNNING, active_path="Paying")
        )
        legacy = ["--url", mongo_url, "--db", db + "_harel"]
        assert "layout version 0" in run("migrate", "status", *legacy).stdout
        up = run("migrate", "up", *legacy)
        assert up.returncode == 0 and "at layout version" in up.stdout, up.stdout + up.stderr[-2000:]
        assert "up to date" in run("migrate", "status", *legacy).stdout
        status = run("status", *legacy)
        assert status.returncode == 0 and "Order" in status.stdout, status.stdout + status.stderr[-2000:]
    finally:
        with pymongo.MongoClient(mongo_url) as client:
            client.drop_database(db)
            client.drop_database(db + "_harel")


@pytest.mark.soak
def test_pip_install_with_extras_into_a_fresh_virtualenv(dist: dict[str, Path], tmp_path: Path, mongo_url: str) -> None:
    """`pip install harel-beanie[server,dashboard]` (the built wheel) into a new virtualenv,
    its dependencies resolved from the index, then the quick start in an empty folder: the
    demo on the embedded server, the dashboard showing it, `status`, `prune`, `migrate`."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", f"{dist['wheel']}[server,dashboard]"], check=True, timeout=1800
    )
    project = tmp_path / "my-project"
    project.mkdir()
    command = [str(venv / "bin" / "harel-beanie")]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MONGODB_URL")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*command, *args], cwd=project, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
        return done

    assert "Run demo-" in run("demo", "-n", "12").stdout
    with _Dashboard(command, project, env) as dashboard:
        dashboard.shows_the_demo()
    assert "Order" in run("status").stdout
    assert " removed of " in run("prune", "--yes", "--finished-before", "1d").stdout
    db = "hbt_pipvenv_" + uuid.uuid4().hex[:8]
    HarelMongoStore(pymongo.MongoClient(mongo_url), db).save(Execution(id="legacy-1", definition_id="Order"))
    try:
        assert "at layout version" in run("migrate", "up", "--url", mongo_url, "--db", db).stdout
        assert "up to date" in run("migrate", "status", "--url", mongo_url, "--db", db).stdout
    finally:
        with pymongo.MongoClient(mongo_url) as client:
            client.drop_database(db)


@pytest.mark.soak
def test_testing_md_runs_in_a_fresh_virtualenv_with_the_testing_extra_alone(
    dist: dict[str, Path], tmp_path: Path, mongo_url: str
) -> None:
    """`pip install harel-beanie[testing]` (the built wheel) into a new virtualenv, its
    dependencies from the index, then docs/testing.md's files saved in an empty folder and its
    `pytest` lines run as printed: the extra alone brings every plugin its fixtures need (the
    async fixture's pytest-asyncio), in memory and on the server (`MONGODB_URL`)."""
    from tests.support.manual_pages import SHELLS, page_blocks, shell_lines

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"{dist['wheel']}[testing]"], check=True, timeout=1800)
    project = tmp_path / "my-project"
    project.mkdir()
    found = page_blocks((REPO / "docs" / "testing.md").read_text())
    for block in found:
        if block.file:
            (project / block.file).write_text(block.body)
    lines = [line for b in found if b.lang in SHELLS and b.fragment is None for line in shell_lines(b)]
    commands = [line.split("  #", 1)[0].strip() for line in lines if line.startswith("pytest")]
    assert commands and (project / "conftest.py").is_file()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(MONGODB_URL=mongo_url, PATH=os.pathsep.join([str(venv / "bin"), env.get("PATH", "")]))
    for command in commands:
        done = subprocess.run(command, shell=True, cwd=project, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and "2 passed" in done.stdout, (command, done.stdout[-3000:], done.stderr[-2000:])
