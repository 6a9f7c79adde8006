"""The pip user's path: a wheel built from the project gives a project of the user's own (an
empty folder, no checkout around) everything the README's quick start needs: `harel-beanie
demo` runs the shop models shipped in the package, `status`, `prune`, `migrate` and
`migrate-transport` answer, and `harel-beanie dashboard` serves its pages, its statechart and
its static files from the package. The sdist carries the tests, the models and the migrations.

The default run installs the built wheel alone into a folder of its own and runs it with
site-packages' dependencies but not this checkout (`python -S`, so the checkout's editable
install is never seen); the soak installs the wheel with its extras into a fresh virtualenv.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import sysconfig
import tarfile
import time
import urllib.request
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheel and the sdist, built from this checkout as a release would be."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-q", "-w", str(out)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(REPO)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    return {"wheel": next(out.glob("*.whl")), "sdist": next(out.glob("*.tar.gz"))}


def test_the_wheel_and_the_sdist_carry_what_a_user_needs(dist: dict[str, Path]) -> None:
    names = set(zipfile.ZipFile(dist["wheel"]).namelist())
    for needed in ("harel_beanie/py.typed", "harel_beanie/shop_models/order.stm", "harel_beanie/shop_models/shop_actions.py",
                   "harel_beanie/dashboard/templates/execution.html", "harel_beanie/dashboard/static/dashboard.js",
                   "harel_beanie/dashboard/static/mermaid.min.js", "harel_beanie/dashboard/static/mermaid.LICENSE"):  # fmt: skip
        assert needed in names, needed
    with tarfile.open(dist["sdist"]) as sdist:
        inside = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    for needed in ("tests/conftest.py", "migrations/0001_adopt_harel_mongostore.py",
                   "src/harel_beanie/shop_models/payment.stm", "Makefile", "pyproject.toml"):  # fmt: skip
        assert needed in inside, needed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _runner(wheel: Path, home: Path) -> Any:
    """`harel-beanie ...` from the wheel alone: installed into a folder of its own, run from an
    empty folder with the dependencies' site-packages and not this checkout."""
    target = home / "installed"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    project = home / "my-project"
    project.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), sysconfig.get_paths()["purelib"]])}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # secantusd-py

    def run(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-S", "-m", "harel_beanie", *args], cwd=project, env=env,
                              capture_output=True, text=True, timeout=kw.pop("timeout", 300), **kw)  # fmt: skip

    run.project, run.env, run.target = project, env, target  # type: ignore[attr-defined]
    return run


def test_the_quick_start_runs_from_the_wheel_alone(dist: dict[str, Path], tmp_path: Path, mongo_url: str) -> None:
    run = _runner(dist["wheel"], tmp_path)
    where = run("demo", "-n", "12").stdout  # no URL: the embedded server, data in ./harel-beanie-data
    assert (run.project / "harel-beanie-data").is_dir(), where
    db = "hbt_pip_" + uuid.uuid4().hex[:8]
    url = ["--url", mongo_url, "--db", db]
    demo = run("demo", "-n", "12", *url)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "Run demo-" in demo.stdout and "Order" in demo.stdout
    for args in (["status"], ["prune", "--finished-before", "30d", "--dry-run"], ["migrate", "status"],
                 ["migrate-transport", "status"]):  # fmt: skip
        done = run(*args, *url)
        assert done.returncode == 0, (args, done.stderr[-2000:])
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-S", "-m", "harel_beanie", "dashboard", *url, "--port", str(port),
                               "--token", "pip-token"], cwd=run.project, env=run.env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(150):  # bounded: 30 s
            try:
                urllib.request.urlopen(f"{base}/static/dashboard.css", timeout=1)
            except urllib.error.HTTPError:
                break  # it answers (401 without the token)
            except OSError:
                time.sleep(0.2)

        def get(path: str) -> str:
            request = urllib.request.Request(base + path, headers={"Authorization": "Bearer pip-token"})
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.read().decode()

        front = get("/")
        assert "Executions" in front and "/static/dashboard.css" in front
        assert len(get("/static/mermaid.min.js")) > 1_000_000
        order = next(line for line in demo.stdout.splitlines() if "this run's ids start with" in line).split()[-1]
        listing = get(f"/api/executions?definition=Order&prefix={order}&limit=1")
        first = __import__("json").loads(listing)["rows"][0]["id"]
        page = get(f"/execution?id={first}")
        assert 'id="statechart-source"' in page and "stateDiagram-v2" in page  # drawn from the packaged models
    finally:
        server.terminate()
        server.wait(timeout=20)
        subprocess.run([sys.executable, "-c", f"import pymongo; pymongo.MongoClient({mongo_url!r}).drop_database({db!r})"],
                       timeout=60)  # fmt: skip


@pytest.mark.soak
def test_pip_install_with_extras_into_a_fresh_virtualenv(dist: dict[str, Path], tmp_path: Path) -> None:
    """`pip install harel-beanie[server,dashboard]` (the built wheel) into a new virtualenv,
    its dependencies resolved from the index, then the demo on the embedded server."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = venv / "bin" / "pip"
    subprocess.run([str(pip), "install", "-q", f"{dist['wheel']}[server,dashboard]"], check=True, timeout=1800)
    project = tmp_path / "my-project"
    project.mkdir()
    demo = subprocess.run([str(venv / "bin" / "harel-beanie"), "demo", "-n", "12"], cwd=project, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert demo.returncode == 0, demo.stderr[-2000:]
    status = subprocess.run([str(venv / "bin" / "harel-beanie"), "status"], cwd=project, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert status.returncode == 0 and "Order" in status.stdout, status.stderr[-2000:]
