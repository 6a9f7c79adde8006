"""The store tests' shared fixtures: the counts' schedule world (tests/support/count_families.py)
and the stuck set's (tests/support/stuck_families.py), one per test, for the explorer's
families and the planted faults alike."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from harel_beanie.store.sync_store import MongoStore
from tests.support.count_families import World, make_world
from tests.support.stuck_families import StuckWorld, make_stuck_world


@pytest.fixture
def world(
    store: MongoStore, client: Any, db_name: str, mongo_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[World]:
    w = make_world(store, client, db_name, monkeypatch, mongo_url)
    yield w
    w.close()


@pytest.fixture
def stuck_world(
    store: MongoStore, client: Any, db_name: str, mongo_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[StuckWorld]:
    w = make_stuck_world(store, client, db_name, monkeypatch, mongo_url)
    yield w
    w.close()
