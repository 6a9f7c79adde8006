"""Shared fixtures: one real MongoDB wire-protocol server for the whole run.

With `MONGODB_URL` set, every test runs against that server (any mongod, replica set or
Atlas). Otherwise the session starts SecantusDB as a child process (`harel_beanie.deploy.embedded`)
and stops it at the end: the server is the one an app's tests get from the package's pytest
plugin (`harel_beanie.testing`, its `harel_mongo_url`), which this suite loads too. Each test
gets a database of its own, dropped afterwards.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any, AsyncIterator, Iterator

import pymongo
import pytest

from harel_beanie import AsyncMongoStore, MongoStore

pytest_plugins = ["harel_beanie.testing"]


#: Modules whose tests each start several processes (worker processes, a second server,
#: pip, a benchmark's workers) and hold bounds in seconds (a takeover, a drain). Under
#: `make test` (pytest-xdist) they are one unit of work: one module after another in the same
#: process, first, so that two of them never share the machine's two cores: together they
#: overloaded it and broke those bounds. Every other module is a unit of its own.
SERIAL = (
    "tests/reliability/test_reliability_network.py",
    "tests/reliability/test_reliability_crash.py",
    "tests/reliability/test_reliability_partitions.py",
    "tests/package/test_bench_smoke.py",
    "tests/store/test_harel_suite.py",
    "tests/package/test_pip_path.py",
    "tests/package/test_manual_as_written.py",
)


def _scope(nodeid: str) -> str:
    module = nodeid.split("::")[0].split("@")[0]
    return "serial" if module in SERIAL else module


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`SERIAL` first: its unit then starts while the other process takes the rest."""
    items.sort(key=lambda item: _scope(item.nodeid) != "serial")


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scheduling by module (as `--dist loadfile`), `SERIAL` as one unit."""
    from xdist.scheduler import LoadScopeScheduling

    class BySerialAndModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return BySerialAndModule(config, log)


@pytest.fixture(scope="session")
def mongo_url(harel_mongo_url: str) -> str:
    return harel_mongo_url


@pytest.fixture(scope="session")
def client(mongo_url: str) -> Iterator[pymongo.MongoClient[Any]]:
    c: pymongo.MongoClient[Any] = pymongo.MongoClient(mongo_url)
    yield c
    c.close()


@pytest.fixture
def db_name(client: pymongo.MongoClient[Any]) -> Iterator[str]:
    name = "hbt_" + uuid.uuid4().hex[:12]
    yield name
    client.drop_database(name)


@pytest.fixture
def store(mongo_url: str, db_name: str) -> Iterator[MongoStore]:
    s = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    yield s
    s.close()


@pytest.fixture
async def astore(mongo_url: str, db_name: str) -> AsyncIterator[AsyncMongoStore]:
    s = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db_name)
    yield s
    await s.close()


@pytest.fixture(params=["sync", "async"])
def either(request: pytest.FixtureRequest, mongo_url: str, db_name: str) -> Iterator[Any]:
    """The sync store, then the async one behind a blocking facade (tests/support/both.py)."""
    from tests.support.both import stores

    yield from stores(request.param, mongo_url, db_name)


# --- figures for docs/RELIABILITY.md (tests/support/figures.py) ---------------------------------


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[Any]:
    """What this test reports about its run, written under its node id when
    `HAREL_BEANIE_FIGURES` names a file (docs/reliability.py sets it); inert otherwise."""
    import time

    from tests.support.figures import Figures, target

    if target() is not None:
        request.getfixturevalue("_figures_session")
    recorded = Figures(request.node.nodeid)
    started = time.monotonic()
    yield recorded
    recorded.flush(time.monotonic() - started)


@pytest.fixture(scope="session")
def _figures_session(client: pymongo.MongoClient[Any]) -> Iterator[None]:
    """One line describing the run: the session's server and the machine."""
    from tests.support.figures import session_record, write

    info = client.admin.command("buildInfo")
    hello = client.admin.command("hello")
    topology = "replica set" if hello.get("setName") else "sharded" if hello.get("msg") == "isdbgrid" else "standalone"
    embedded = not os.environ.get("MONGODB_URL")
    server = {
        "name": "SecantusDB (embedded)" if embedded else "MONGODB_URL",
        "version": str(info.get("version")),
        "topology": topology,
    }
    write(session_record(server))
    yield


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test's outcome beside its figures, when they are recorded."""
    from tests.support.figures import target, write

    if target() is None:
        return
    if (
        report.when == "call"
        or (report.when == "setup" and not report.passed)
        or (report.when == "teardown" and report.failed)
    ):
        outcome = report.outcome
        reason = getattr(report, "wasxfail", None)
        if reason is not None:
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.skipped and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        phase = "" if report.when == "call" else f" in {report.when}"
        write(
            {
                "kind": "outcome",
                "test": report.nodeid,
                "outcome": outcome + phase,
                "reason": reason,
                "seconds": round(report.duration, 2),
            }
        )


def pytest_configure(config: pytest.Config) -> None:
    """The file harel's side-by-side table is written to, named once by the process that
    prints the summary (pytest-xdist's workers inherit it)."""
    from tests.support.harel_suite import REPORT_ENV

    if REPORT_ENV not in os.environ:
        fd, path = tempfile.mkstemp(prefix="hb-harel-suite-", suffix=".txt")
        os.close(fd)
        os.environ[REPORT_ENV] = config._hb_suite_report = path  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    path = getattr(config, "_hb_suite_report", None)
    if path and os.path.exists(path):
        os.unlink(path)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The side-by-side counts of harel's suite on harel's store and on this one."""
    from tests.support.harel_suite import REPORT_ENV

    path = os.environ.get(REPORT_ENV)
    lines = open(path, encoding="utf-8").read().splitlines() if path and os.path.exists(path) else []
    if lines:
        terminalreporter.section("harel's own tests: harel's Mongo stores beside harel_beanie's")
        for line in lines:
            terminalreporter.write_line(line)
