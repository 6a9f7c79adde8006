"""harel's own tests for its Mongo stores and its generic engine tests, from harel's sdist,
with this store swapped in for harel's (and, for the engine tests, for the in-memory
store), beside the same files run on harel's own MongoStore / AsyncMongoStore: on
mongomock / mongomock-motor and on the real server. Ours must pass wherever harel's does.

The default run takes the Mongo-store files and a share of the engine tests; the whole
engine suite runs under the `soak` marker. The counts are printed at the end of the run.
"""

from __future__ import annotations

import pytest

from tests.harel_suite import ENGINE_DIRS, ENGINE_SUBSET, MONGO_FILES, passed, report, side_by_side, table


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
