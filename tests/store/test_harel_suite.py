"""harel's own tests for its Mongo stores and its generic engine tests, from harel's sdist,
with this store swapped in for harel's (and, for the engine tests, for the in-memory
store), beside the same files run on harel's own MongoStore / AsyncMongoStore: on
mongomock / mongomock-motor and on the real server. Ours must pass wherever harel's does.

harel's tests of its Mongo transports run on this package's transport (and store), on both
backends: none may fail; the few that read harel's own collections are excluded, each named
with its reason (`TRANSPORT_EXCLUDED`), and a test that skips must be one named as skipping
there (`TRANSPORT_SKIPPED`).

The default run takes the Mongo-store files and a share of the engine tests; the whole
engine suite runs under the `soak` marker. The counts are printed at the end of the run.
"""

from __future__ import annotations

import os
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.support.harel_suite import (
    ENGINE_DIRS,
    ENGINE_SUBSET,
    MONGO_FILES,
    SKIP_ENV,
    TRANSPORT_EXCLUDED,
    TRANSPORT_SKIPPED,
    TRANSPORT_TESTS,
    passed,
    report,
    side_by_side,
    suite_root,
    table,
    transport_runs,
    transport_table,
)


def check(title: str, url: str, targets: list[str]) -> None:
    runs = side_by_side(url, targets)
    report(table(title, runs))
    for backend in ("mongomock", "server"):
        theirs, ours = passed(runs[("harel", backend)]), passed(runs[("ours", backend)])
        assert ours, f"no test of harel's passed on {backend} with this store: did the suite run?"
        assert not theirs - ours, f"on {backend}, pass on harel's store only: {sorted(theirs - ours)}"


def test_harels_suite_side_by_side(mongo_url: str) -> None:
    check("harel's Mongo-store tests and a share of its engine tests:", mongo_url, MONGO_FILES + ENGINE_SUBSET)


@pytest.mark.soak
def test_harels_whole_engine_suite_side_by_side(mongo_url: str) -> None:
    check("harel's Mongo-store tests and its whole engine suite:", mongo_url, MONGO_FILES + ENGINE_DIRS)


def test_harels_transport_tests_on_this_transport(mongo_url: str) -> None:
    """harel's tests of its MongoTransport and AsyncMongoTransport, this package's transport
    swapped in, holding every partition by lease as a lone worker does (`tests/support/harel_swap.py`:
    its claims take the owned-partitions path). Its priority-on-drain tests (sync and async) failed on both backends while a
    drained group kept its first priority."""
    runs = transport_runs(mongo_url)
    report(transport_table(runs))
    selected = [t for t in TRANSPORT_TESTS if "::" in t]  # the files run whole are counted below
    for backend, results in runs.items():
        failed = sorted(t for t, o in results.items() if o == "failed")
        assert not failed, f"on {backend}, harel's transport tests failed on this transport: {failed}"
        skipped = {t for t, o in results.items() if o == "skipped"}
        assert skipped <= set(TRANSPORT_SKIPPED[backend]), f"on {backend}, unexpected skips: {skipped}"
        assert not set(TRANSPORT_EXCLUDED) & set(results), f"on {backend}, an excluded test ran"
        missing = [t for t in selected if t not in results and t not in TRANSPORT_EXCLUDED]
        assert not missing, f"on {backend}, these did not run: {missing}"
        assert len(passed(results)) >= 30, f"on {backend}, only {sorted(passed(results))} passed"
        for drain in (
            "test/unit/engine/test_mongo_transport.py::test_priority_reset_on_drain",
            "test/integration/test_async_mongo.py::test_async_mongo_transport_priority_reset_on_drain",
        ):
            assert results.get(drain) == "passed", f"on {backend}: {drain} {results.get(drain)}"


def test_an_sdist_that_cannot_be_had_fails_naming_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty cache and a pip that can reach no index (no config file, `--no-index`, no
    find-links): the tests that need harel's sdist fail, not skip, and the message names the
    file, where to put it, the index variables and the opt-out; with the opt-out set they
    skip, naming it."""
    monkeypatch.setenv("HAREL_BEANIE_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv(SKIP_ENV, raising=False)
    with pytest.raises(pytest.fail.Exception) as failed:
        suite_root()
    said = str(failed.value)
    tarball = tmp_path / f"harel-{version('harel')}.tar.gz"
    assert str(tarball) in said and "PIP_INDEX_URL" in said and f"{SKIP_ENV}=1" in said, said
    assert not tarball.exists()
    monkeypatch.setenv(SKIP_ENV, "1")
    with pytest.raises(pytest.skip.Exception) as skipped:
        suite_root()
    assert SKIP_ENV in str(skipped.value)
