"""The execution counts kept up to date (`harel_beanie.core.counting`): exact against a full
count of the collection after runs of the shop models, folds, purges, prunes, and crashes
injected between the steps of a fold and of a removal; and read in a bounded number of
commands whatever the collection holds."""

from __future__ import annotations

import random
from typing import Any

import pytest
from harel.engine.schema import DEFAULT_PREFIX

from harel_beanie.core.counting import LEAVING
from harel_beanie.core.documents import counts_collection
from harel_beanie.ops.drivers import ManualClock, SyncDurable, order_steps
from harel_beanie.ops.loader import load_models
from harel_beanie.store.sync_store import MongoStore


@pytest.fixture(scope="module")
def definitions() -> dict[str, Any]:
    return load_models()


def full_counts(db: Any) -> tuple[dict[str, dict[str, int]], int, int]:
    """What the counters must equal: every execution (not one prune has begun removing) by
    definition and status, the tombstones, the sum of the versions; one pass over all."""
    per: dict[str, dict[str, int]] = {}
    purged = commits = 0
    for d in db[f"{DEFAULT_PREFIX}_executions"].find(
        {}, {"definition_id": 1, "status": 1, "version": 1, "tomb": 1, LEAVING: 1}
    ):
        if d.get(LEAVING):
            continue
        if "tomb" in d:
            purged += 1
            continue
        s = per.setdefault(d["definition_id"], {})
        s[d.get("status") or "UNKNOWN"] = s.get(d.get("status") or "UNKNOWN", 0) + 1
        commits += d.get("version") or 0
    return per, purged, commits


def check(store: MongoStore, db: Any) -> None:
    got = store.read_counts()
    assert got is not None
    assert (got.per, got.purged, got.commits) == full_counts(db)


def run_orders(store: MongoStore, definitions: dict[str, Any], rng: random.Random, n: int, tag: str) -> None:
    driver = SyncDurable(store, definitions, ManualClock(), execution="inline")
    for i in range(n):
        steps = order_steps(f"{tag}-{i}", card=rng.choice(["visa", "visa", "declined"]), scans=rng.randint(0, 2))
        driver.run(steps[: rng.randint(1, len(steps))])


def test_counts_follow_runs_and_folds(
    store: MongoStore, client: Any, db_name: str, definitions: dict[str, Any]
) -> None:
    db = client[db_name]
    rng = random.Random(7)
    store.init()
    assert store.read_counts() is None  # no counter built yet
    store.fold_counts()
    check(store, db)
    run_orders(store, definitions, rng, 12, "a")
    check(store, db)  # nothing folded: the dirty documents correct the counters
    assert store.fold_counts() > 0
    check(store, db)
    run_orders(store, definitions, rng, 6, "b")
    check(store, db)
    store.fold_counts()
    check(store, db)
    assert db[counts_collection(DEFAULT_PREFIX)].count_documents({}) == store.partitions.parts
