"""A worker's retention (`Worker(retain=...)`, `harel-beanie worker --retain`,
harel_beanie.retention.schedule): it removes what finished longer ago than its age and
nothing else, only in the partitions it leases, each removal archived once, the counts exact
after; it drops the retired TTL index; its flags and arguments are refused naming them.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pymongo
import pytest
from harel.engine.execution import Execution, Status

from harel_beanie import AsyncMongoStore, Worker, retention
from harel_beanie.core.partitions import Held, PartitionScope
from harel_beanie.deploy import default_models_dir, load_models
from harel_beanie.retention.schedule import JITTER, Retention, retain_forever, retain_once
from tests.commands.test_cli import run_cli
from tests.support.exact_counts import exact_counts

DAY = 86400.0
#: a bound on a hang while the worker retains, not a measure (a loaded 2-core machine)
SETTLE = 120.0


def _exe(i: str, status: Status, finished: float | None, parent: str | None = None) -> Execution:
    # a finished execution's `updated_at` is its finishing commit's: what prune's windows read
    at = finished or time.time()
    return Execution(id=i, definition_id="Order", status=status, updated_at=at, finished_at=finished, parent_id=parent)


async def _seed(store: Any, now: float) -> tuple[set[str], set[str]]:
    """Executions of every kind a retention of 30 days meets: (removable, kept)."""
    old, recent = now - 40 * DAY, now - DAY
    removable, kept = set(), set()
    for k in range(10):
        eid = f"old-{k:02d}"
        await store.save(_exe(eid, Status.DONE if k % 3 else Status.CANCELLED, old))
        removable.add(eid)
    await store.save(_exe("old-00:A:0", Status.DONE, old, parent="old-00"))  # parent finished too: goes
    removable.add("old-00:A:0")
    for eid, status, finished, parent in (
        ("recent", Status.DONE, recent, None),  # finished inside the retention
        ("failed", Status.FAILED, None, None),  # a dead letter: never removed
        ("running", Status.RUNNING, None, None),
        ("running:A:0", Status.DONE, old, "running"),  # its parent still going: kept
    ):
        await store.save(_exe(eid, status, finished, parent))
        kept.add(eid)
    await store.fold_counts()
    return removable, kept


def _ids(client: Any, db: str) -> set[str]:
    return {d["_id"] for d in client[db].harel_executions.find({}, {"_id": 1})}


async def test_a_retaining_worker_removes_what_is_due_and_nothing_else(
    mongo_url: str, db_name: str, client: Any
) -> None:
    """An app's own worker told to retain 30 days: every execution that finished earlier (and
    has nothing to hand on, no parent going) is removed, archived once into its collection;
    the rest stays; every source of the counts equals the documents; the TTL index an older
    release left is dropped, and the worker says so."""
    store = await AsyncMongoStore.from_url(mongo_url, db_name)
    try:
        removable, kept = await _seed(store, time.time())
        client[db_name].harel_executions.create_index(
            [("finished_on", 1)], name=retention.TTL_INDEX, expireAfterSeconds=40 * DAY
        )
        lines: list[str] = []
        stop = asyncio.Event()
        worker = Worker(
            mongo_url,
            load_models(default_models_dir()),
            db_name=db_name,
            concurrency=4,
            sweep_every=0.5,
            retain="30d",
            retain_every=0.3,
            archive_collection="pruned",
            say=lines.append,
        )
        running = asyncio.create_task(worker.run(stop))
        deadline = time.monotonic() + SETTLE
        said = lambda: sum(int(line.split("removed ")[1].split()[0]) for line in lines if "retention removed" in line)  # noqa: E731
        while said() < len(removable) and time.monotonic() < deadline and not running.done():
            await asyncio.sleep(0.2)
        waited = SETTLE - (deadline - time.monotonic())
        stop.set()
        await running
        assert _ids(client, db_name) == kept, (f"after {waited:.0f}s", lines)
        records = list(client[db_name].pruned.find({}, {"execution_id": 1}))
        assert Counter(r["execution_id"] for r in records) == Counter(removable)  # each once
        assert retention.TTL_INDEX not in {ix["name"] for ix in client[db_name].harel_executions.list_indexes()}
        assert any("dropped the TTL index" in line for line in lines), lines
        assert said() == len(removable), lines  # what it said it removed is what went
        check = await exact_counts(store, mongo_url)
        assert not check.problems, "\n".join(check.problems)
    finally:
        await store.close()


async def test_a_run_removes_only_in_the_partitions_the_worker_leases(mongo_url: str, db_name: str) -> None:
    """Each partition's batch is removed by the worker that leases it: a run over a scope
    holding some partitions removes the due executions of those, and a scope holding none
    removes nothing; the counts of every partition stay exact."""
    store = await AsyncMongoStore.from_url(mongo_url, db_name)
    aclient: Any = pymongo.AsyncMongoClient(mongo_url)
    try:
        removable, _ = await _seed(store, time.time())
        coll = aclient[db_name].harel_executions
        parts = {d["_id"]: d["part"] for d in await coll.find({}, {"part": 1}).to_list(None)}
        mine = sorted({parts[i] for i in removable})[:2]
        scope = PartitionScope(held={})
        plan = Retention(age=30 * DAY, batch_size=3)
        nothing = await retain_once(coll, plan, scope, time.time)
        assert nothing.removed == 0 and nothing.examined == 0
        scope.held = {p: Held(epoch=1, until=float("inf")) for p in mine}
        report = await retain_once(coll, plan, scope, time.time)
        expected = {i for i in removable if parts[i] in mine}
        assert expected and sorted(report.removed_ids) == sorted(expected)
        left = {d["_id"] for d in await coll.find({}, {"_id": 1}).to_list(None)}
        assert left.isdisjoint(expected) and (removable - expected) <= left
        await store.fold_counts()
        counts = await store.read_counts()
        assert counts is not None
        stored = Counter(d["status"] for d in await coll.find({"data": {"$exists": True}}, {"status": 1}).to_list(None))
        totals: Counter[str] = Counter()
        for per in counts.per.values():
            totals.update(per)
        assert {s: n for s, n in totals.items() if n} == dict(stored)
    finally:
        await aclient.close()
        await store.close()


async def test_runs_come_about_every_period_within_the_jitter(mongo_url: str, db_name: str) -> None:
    """Each wait is drawn within `JITTER` of the period: a draw of 0 waits (1 - JITTER) of it,
    and the loop ends when told to stop, whatever it is waiting for."""
    aclient: Any = pymongo.AsyncMongoClient(mongo_url)
    try:
        coll = aclient[db_name].harel_executions
        stop = asyncio.Event()
        runs: list[float] = []

        async def counted(*args: Any) -> Any:
            runs.append(time.monotonic())
            if len(runs) == 3:
                stop.set()
            return retention.PruneReport(before=0.0, dry_run=False)

        from harel_beanie.retention import schedule

        real = schedule.retain_once
        schedule.retain_once = counted  # type: ignore[assignment]
        try:
            start = time.monotonic()
            plan = Retention(age=DAY, every=0.2)
            await asyncio.wait_for(retain_forever(coll, plan, None, stop, draw=lambda: 0.0), timeout=30)
        finally:
            schedule.retain_once = real  # type: ignore[assignment]
        assert len(runs) == 3
        assert runs[0] - start >= 0.2 * (1 - JITTER) * 0.99  # the first run waits too
    finally:
        await aclient.close()


@pytest.mark.parametrize(
    "argv,named",
    [
        (["--retain", "30"], "--retain"),  # seconds or days? refused naming the units
        (["--retain", "soon"], "--retain"),
        (["--archive", "a.jsonl"], "--archive"),  # an archive with nothing to retain
        (["--archive-collection", "pruned"], "--archive-collection"),
        (["--retain-every", "5"], "--retain-every"),
        (["--retain", "30d", "--archive", "a.jsonl", "--archive-collection", "p"], "choose one"),
    ],
)
def test_the_worker_refuses_a_retention_flag_naming_it(tmp_path: Path, argv: list[str], named: str) -> None:
    """In one line, before any server is reached (nothing answers on the URL given)."""
    out = run_cli(
        "worker", "--url", "mongodb://127.0.0.1:1", "--definitions", str(default_models_dir()), *argv, cwd=tmp_path
    )
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert named in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize(
    "kwargs,named",
    [
        ({"retain": "30"}, "retain"),
        ({"retain": "0s"}, "retain"),
        ({"retain": "30d", "retain_every": 0.0}, "retain_every"),
        ({"archive_collection": "pruned"}, "archive_collection"),
        ({"retain": "30d", "archive": object()}, "archive"),
    ],
)
def test_the_worker_class_refuses_a_retention_argument_naming_it(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises((TypeError, ValueError), match=named):
        Worker("mongodb://127.0.0.1:1", {"Order": object()}, **kwargs)


def test_the_command_states_the_schedules_period_and_bound_as_the_schedule_does() -> None:
    """The command keeps its own copies (importing the schedule would load retention for `--help`)."""
    from harel_beanie.commands import worker as command
    from harel_beanie.retention import schedule

    assert (command.RETAIN_EVERY, command.MAX_RETAIN_EVERY) == (schedule.RETAIN_EVERY, schedule.MAX_RETAIN_EVERY)
