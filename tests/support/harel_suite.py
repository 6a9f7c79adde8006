"""harel's own test suite, run from harel's sdist with a Mongo store swapped in.

`suite_root()` finds harel's sdist for the installed harel version (downloaded once with
`pip download` into a cache directory, never into this repository) and returns the unpacked
tree; `run_suite(...)` runs some of its test files in a child pytest with the
`tests.support.harel_swap` plugin and returns each test's outcome.

An sdist that cannot be had fails the tests that need it, naming the fix: a skip would let
`make test` pass without the suite that holds this store to harel's own contracts. Only
`SKIP_ENV=1`, set on purpose (a machine with no route to an index, such as a packager's
sandbox), turns it into a skip, which names the variable.
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
from typing import NoReturn, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]

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


#: set to 1 to skip harel's own suites where its sdist cannot be had (docs/testing.md)
SKIP_ENV = "HAREL_BEANIE_SKIP_HAREL_SUITE"


def unavailable(v: str, why: str) -> NoReturn:
    """Fail (or, with `SKIP_ENV=1`, skip) a test that needs harel's sdist, saying how to
    provide it."""
    tarball = cache_dir() / f"harel-{v}.tar.gz"
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1: harel's own suites not run (harel's sdist: {why})")
    pytest.fail(
        f"harel's own test suites need harel's sdist (harel-{v}.tar.gz), which could not be had: {why}\n"
        f"Fix: let `pip download harel=={v} --no-binary :all:` reach PyPI (or an index holding the sdist: "
        f"PIP_INDEX_URL, PIP_FIND_LINKS), or put the file at {tarball} (HAREL_BEANIE_CACHE names another "
        f"folder). To run the rest of the suite without them, on purpose: {SKIP_ENV}=1.",
        pytrace=False,
    )


def suite_root() -> Path:
    """The unpacked sdist of the installed harel (its `test/` and `pyproject.toml`)."""
    v = version("harel")
    root = cache_dir() / f"harel-{v}"
    if (root / "test").is_dir():
        return root
    cache_dir().mkdir(parents=True, exist_ok=True)
    tarball = cache_dir() / f"harel-{v}.tar.gz"
    if not tarball.exists():
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"harel=={v}",
            "-d",
            str(cache_dir()),
            "-q",
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            unavailable(v, "`pip download` did not finish within 300 s")
        if done.returncode != 0 or not tarball.exists():
            unavailable(v, f"`pip download` said: {done.stderr.strip()[-300:] or f'exit status {done.returncode}'}")
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp, tarfile.open(tarball) as tar:
        tar.extractall(tmp, filter="data")
        try:
            (Path(tmp) / f"harel-{v}").rename(root)
        except OSError:
            # another test run on this machine unpacked the same release first (a rename onto a
            # directory that exists fails): theirs is the same tarball's contents
            if not root.is_dir():
                raise
    return root


def run_suite(
    store: str,
    server: str,
    targets: list[str],
    *,
    transport: str = "harel",
    deselect: tuple[str, ...] = (),
    timeout: float = 1800,
    keyword: Optional[str] = None,
) -> dict[str, str]:
    """Run `targets` (paths relative to the sdist) of harel's suite with `store` ("ours" or
    "harel") and `transport` (the same) on `server` ("mongomock" or a URL). Returns test id ->
    passed/failed/skipped."""
    root = suite_root()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        env = {
            **os.environ,
            "HB_SWAP_STORE": store,
            "HB_SWAP_SERVER": server,
            "HB_SWAP_TRANSPORT": transport,
            "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
        for var in ("HAREL_STORE_BACKEND", "HAREL_TRANSPORT_BACKEND", "HAREL_MONGO_URL", "HAREL_MONGO_DB"):
            env.pop(var, None)
        if server != "mongomock":  # harel's `stack` tests for its Mongo stores (and transports)
            env.update(
                HAREL_STORE_BACKEND="mongo", HAREL_MONGO_URL=server, HAREL_MONGO_DB="hbx_" + uuid.uuid4().hex[:12]
            )
            if transport == "ours":
                env.update(HAREL_TRANSPORT_BACKEND="mongo")
        elif transport == "ours":
            # harel's async transport tests need a server, and skip without one: this
            # transport's `from_url` makes a mongomock-motor client instead (tests/support/harel_swap.py),
            # so the URL is never dialled
            env.update(
                HAREL_STORE_BACKEND="mongo", HAREL_MONGO_URL="mongodb://in-memory.invalid", HAREL_MONGO_DB="harel"
            )
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.support.harel_swap",
            # the installed harel, not the sdist's src/: the one this store is built against
            "-o",
            "pythonpath=test deploy",
            "-m",
            "stack or not stack",
            "--junitxml",
            str(report),
            "-o",
            "junit_family=xunit1",
            "--continue-on-collection-errors",
            *targets,
        ]
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


# harel's tests of its Mongo transports, run on this package's (tests/support/harel_swap.py,
# HB_SWAP_TRANSPORT=ours) beside this package's store. Node ids: the other tests of these
# files are of other backends, or of the stores (run by the side-by-side table above).
_ASYNC_MONGO = "test/integration/test_async_mongo.py::"
TRANSPORT_TESTS = [
    "test/unit/engine/test_mongo_transport.py",
    "test/unit/engine/test_transport_race.py",
    "test/unit/engine/test_transport_contract.py::test_mongo",
    "test/unit/engine/test_schema.py::test_mongo_contracts_under_a_prefix",
    "test/unit/engine/test_schema.py::test_two_prefixes_share_one_mongo_database",
    "test/unit/engine/test_schema.py::test_mongo_without_create_schema_creates_no_index",
    "test/unit/engine/test_schema.py::test_the_mongo_upgrade_renames_reach_the_new_names",
    "test/unit/engine/test_mongo_store.py::test_pipeline_flat_pure_mongo",
    "test/unit/engine/test_mongo_store.py::test_pipeline_orthogonal_pure_mongo",
    "test/integration/test_transport_contract.py::test_mongo_transport_contract",
    *(
        _ASYNC_MONGO + name
        for name in (
            "test_fifo_within_a_group",
            "test_one_in_flight_per_group_but_other_groups_proceed",
            "test_ack_removes_the_message",
            "test_nack_returns_the_message_immediately",
            "test_a_held_lease_blocks_other_claims",
            "test_ack_by_a_stale_owner_is_a_noop",
            "test_lease_expiry_makes_a_message_claimable_again",
            "test_async_mongo_transport_round_robin",
            "test_async_mongo_transport_min_priority_filters",
            "test_async_mongo_transport_priority_reset_on_drain",
            "test_pipeline_flat_async_mongo",
            "test_pipeline_orthogonal_async_mongo",
        )
    ),
]

#: harel's transport tests not run on this transport: each reaches into harel's own
#: collections, which this transport does not have
TRANSPORT_EXCLUDED = {
    "test/unit/engine/test_transport_race.py::test_a_publish_between_acks_check_and_delete_keeps_its_group": (
        "replaces harel's private messages collection (`_msgs`) to land a publish between two of "
        "harel's ack commands; this transport's ack is one conditional write to the group's queue "
        "document, with no such window"
    ),
    "test/unit/engine/test_transport_race.py::test_a_publish_while_claim_drops_an_empty_group_keeps_it": (
        "deletes a group's messages from harel's private messages collection to leave an empty group; "
        "this transport keeps them in the queue document (its empty-group reset: Rule 5 of "
        "transport/queues.py)"
    ),
    "test/unit/engine/test_schema.py::test_mongo_without_create_schema_creates_no_index": (
        "reads the index of harel's `<prefix>_transport_locks` collection; this transport's "
        "collections are `<prefix>_hb_queues` and `<prefix>_hb_overflow`"
    ),
    "test/unit/engine/test_schema.py::test_the_mongo_upgrade_renames_reach_the_new_names": (
        "renames harel's transport collections from their 0.6 names; this transport never had them "
        "(messages move from harel's transport with `harel-beanie migrate-transport`)"
    ),
}

#: harel's transport tests that skip themselves, by backend, and why
TRANSPORT_SKIPPED = {
    "mongomock": {
        "test/integration/test_transport_contract.py::test_mongo_transport_contract": (
            "builds `pymongo.MongoClient(url)` itself, so needs a server; the same contract runs on "
            "mongomock in test/unit/engine/test_transport_contract.py::test_mongo"
        ),
    },
    "server": {},
}


def transport_runs(url: str) -> dict[str, dict[str, str]]:
    """harel's transport tests on this package's transport and store: backend -> outcomes."""
    deselect = tuple(TRANSPORT_EXCLUDED)
    return {
        backend: run_suite("ours", server, TRANSPORT_TESTS, transport="ours", deselect=deselect)
        for backend, server in (("mongomock", "mongomock"), ("server", url))
    }


def transport_table(runs: dict[str, dict[str, str]]) -> list[str]:
    lines = ["harel's Mongo-transport tests on harel_beanie's transport:"]
    lines.append(f"  {'backend':<12}{'passed':>8}{'failed':>8}{'skipped':>9}{'excluded':>10}")
    for backend, results in runs.items():
        counts = [sum(1 for v in results.values() if v == k) for k in ("passed", "failed", "skipped")]
        lines.append(f"  {backend:<12}{counts[0]:>8}{counts[1]:>8}{counts[2]:>9}{len(TRANSPORT_EXCLUDED):>10}")
    for backend, results in runs.items():
        lines += [f"  failed on {backend}: {t}" for t, o in sorted(results.items()) if o == "failed"]
    lines.append("  excluded on both backends:")
    lines += [f"    {test}: {why}" for test, why in TRANSPORT_EXCLUDED.items()]
    for backend, skips in TRANSPORT_SKIPPED.items():
        lines += [f"  skipped on {backend}: {test}: {why}" for test, why in skips.items()]
    return lines
