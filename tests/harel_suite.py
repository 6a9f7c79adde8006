"""harel's own test suite, run from harel's sdist with a Mongo store swapped in.

`suite_root()` finds harel's sdist for the installed harel version (downloaded once with
`pip download` into a cache directory, never into this repository) and returns the unpacked
tree; `run_suite(...)` runs some of its test files in a child pytest with the
`tests.harel_swap` plugin and returns each test's outcome.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
import uuid
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path
from typing import Optional

import pytest

REPO = Path(__file__).resolve().parent.parent

# the files of harel's suite that exercise a store: its Mongo-store tests (mongomock and,
# marked `stack`, a real server) and its generic engine tests (which build DictStore)
MONGO_FILES = [
    "test/unit/engine/test_mongo_store.py",
    "test/unit/engine/test_store_listing.py",
    "test/unit/engine/test_store_outbox.py",
    "test/unit/engine/test_store_purge.py",
    "test/integration/test_mongo_store.py",
    "test/integration/test_async_mongo.py",
    "test/integration/test_store_listing.py",
    "test/integration/test_store_outbox.py",
    "test/integration/test_store_purge.py",
]
ENGINE_DIRS = ["test/unit/engine"]


def cache_dir() -> Path:
    base = os.environ.get("HAREL_BEANIE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "harel-beanie"
    )
    return Path(base)


def suite_root() -> Path:
    """The unpacked sdist of the installed harel (its `test/` and `pyproject.toml`)."""
    v = version("harel")
    root = cache_dir() / f"harel-{v}"
    if (root / "test").is_dir():
        return root
    cache_dir().mkdir(parents=True, exist_ok=True)
    tarball = cache_dir() / f"harel-{v}.tar.gz"
    if not tarball.exists():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               f"harel=={v}", "-d", str(cache_dir()), "-q"]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or not tarball.exists():
            pytest.skip(f"harel's sdist could not be downloaded: {done.stderr.strip()[-300:]}")
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp, tarfile.open(tarball) as tar:
        tar.extractall(tmp, filter="data")
        (Path(tmp) / f"harel-{v}").rename(root)
    return root


def run_suite(
    store: str,
    server: str,
    targets: list[str],
    *,
    deselect: tuple[str, ...] = (),
    timeout: float = 1800,
    keyword: Optional[str] = None,
) -> dict[str, str]:
    """Run `targets` (paths relative to the sdist) of harel's suite with `store` ("ours" or
    "harel") on `server` ("mongomock" or a URL). Returns test id -> passed/failed/skipped."""
    root = suite_root()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        env = {**os.environ, "HB_SWAP_STORE": store, "HB_SWAP_SERVER": server,
               "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}  # fmt: skip
        if server != "mongomock":  # harel's `stack` tests for its Mongo stores
            env.update(
                HAREL_STORE_BACKEND="mongo", HAREL_MONGO_URL=server, HAREL_MONGO_DB="hbx_" + uuid.uuid4().hex[:12]
            )
        else:
            env.pop("HAREL_STORE_BACKEND", None)
        cmd = [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.harel_swap",
            # the installed harel, not the sdist's src/: the one this store is built against
            "-o", "pythonpath=test deploy", "-m", "stack or not stack", "--junitxml", str(report),
            "-o", "junit_family=xunit1", "--continue-on-collection-errors",
            *targets,
        ]  # fmt: skip
        for d in deselect:
            cmd += ["--deselect", d]
        if keyword:
            cmd += ["-k", keyword]
        subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        if not report.exists():
            raise RuntimeError(f"harel's suite did not run: {' '.join(cmd)}")
        return outcomes(report)


def outcomes(report: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('file') or case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            out[name] = "failed"
        elif "skipped" in kinds:
            out[name] = "skipped"
        else:
            out[name] = "passed"
    return out


def passed(results: dict[str, str]) -> set[str]:
    return {k for k, v in results.items() if v == "passed"}


# the default run's share of the engine tests: the runners (sync, async, distributed),
# dedupe, timers, traces and purge
ENGINE_SUBSET = [
    "test/unit/engine/test_durable.py",
    "test/unit/engine/test_idempotency.py",
    "test/unit/engine/test_timers.py",
    "test/unit/engine/test_trace.py",
    "test/unit/engine/test_purge.py",
    "test/unit/engine/aio/test_async_distributed.py",
]

#: names the file the side-by-side table is written to, for the run's terminal summary
#: (tests/conftest.py): a file, because under pytest-xdist the test runs in a worker process
#: and the summary is printed by the controller
REPORT_ENV = "HAREL_BEANIE_SUITE_REPORT"


def report(lines: list[str]) -> None:
    """Add `lines` to the run's summary."""
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)


def side_by_side(url: str, targets: list[str]) -> dict[tuple[str, str], dict[str, str]]:
    """Each store on each backend over `targets`: (store, backend) -> outcomes."""
    runs = {}
    for backend, server in (("mongomock", "mongomock"), ("server", url)):
        for store in ("harel", "ours"):
            runs[(store, backend)] = run_suite(store, server, targets)
    return runs


def table(title: str, runs: dict[tuple[str, str], dict[str, str]]) -> list[str]:
    lines = [title, f"  {'store, backend':<34}{'passed':>8}{'failed':>8}{'skipped':>9}"]
    for (store, backend), results in runs.items():
        who = f"{'harel MongoStore' if store == 'harel' else 'harel_beanie'}, {backend}"
        counts = [sum(1 for v in results.values() if v == k) for k in ("passed", "failed", "skipped")]
        lines.append(f"  {who:<34}{counts[0]:>8}{counts[1]:>8}{counts[2]:>9}")
    return lines
