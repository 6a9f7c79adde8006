"""Prune's rate on the embedded server, with the counts' fold marking a batch in one bulk
write or (`--old-marks`) one round trip per execution, as before issue 39's item 4; and the
counts' one-pass build over the same executions first (what `migrate up` and a worker's first
sweep do on this server).

Run: `.venv/bin/python -m bench.scale.prune_rate 20000 5000` (executions stored, executions pruned
at most), then again with `--old-marks`; compare within one run of both, the machine may be
shared. The executions are one finished execution's document cloned (DONE long ago, every
partition), written as a version before the counters wrote them (no marks, no counters).

`--ceiling` measures instead what this server allows any prune: the same executions removed
by bare `delete_many` by `_id`, 500 a command, and marked by bare `update_many`, with the
store's indexes and with `_id` alone. A prune writes each execution at least once (its
delete), so the bare delete's rate bounds every prune's on this server.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import time
from typing import Any, Iterator

import pymongo
from harel.engine.execution import Execution, Status

from harel_beanie import MongoStore
from harel_beanie.core.calls import Flow, UpdateOne
from harel_beanie.core.flows import counting as counting_flows
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, part_of
from harel_beanie.deploy.embedded import EmbeddedServer
from harel_beanie.retention import prune

OLD = 1_700_000_000.0
DB = "hbbench_prune"
BATCH = 500


def _old_mark(part: int, seq: int, entries: list[dict[str, Any]]) -> Flow[None]:
    """The fold's marks one round trip each (before the bulk write)."""
    yield from counting_flows._mark_each(part, seq, entries)
    yield UpdateOne("counts", {"_id": part, "seq": seq}, {"$set": {"marked": True}})


def _clones(template: dict[str, Any], n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        d = copy.deepcopy(template)
        d["_id"] = f"x{i:07d}"
        d["part"] = part_of(d["_id"], DEFAULT_PARTITIONS)
        d["born"] = f"b{i}"
        d["updated_at"] = d["finished_at"] = OLD + i * 0.001
        for k in ("cdirty", "cc", "cseq", "quiet"):
            d.pop(k, None)
        yield d


def _seeded(url: str, n: int) -> tuple[Any, MongoStore, Any, list[dict[str, Any]]]:
    """The store set up on `url` (every index) and `n` clones of one finished execution's
    document, not yet written."""
    client: Any = pymongo.MongoClient(url)
    store = MongoStore(pymongo.MongoClient(url), DB)
    store.init()
    store.save(Execution(id="tmpl", definition_id="Order", status=Status.DONE, updated_at=OLD, finished_at=OLD))
    exes = client[DB].harel_executions
    return client, store, exes, list(_clones(exes.find_one({"_id": "tmpl"}), n))


def _reload(exes: Any, rows: list[dict[str, Any]]) -> None:
    exes.delete_many({})
    for i in range(0, len(rows), 5000):
        exes.insert_many(rows[i : i + 5000])


def run(n: int, most: int, old_marks: bool) -> None:
    if old_marks:
        counting_flows._mark = _old_mark  # type: ignore[assignment]
    with EmbeddedServer() as server:
        client, store, exes, rows = _seeded(server.url, n)
        _reload(exes, rows)
        client[DB].harel_hb_counts.delete_many({})
        t = time.perf_counter()
        store.fold_counts(build_batch=0)
        print(f"{n:,} executions; the counts built in one pass in {time.perf_counter() - t:.1f} s", flush=True)
        marks: list[tuple[float, int]] = []

        async def pruned() -> None:
            aclient: Any = pymongo.AsyncMongoClient(server.url)
            t0 = time.perf_counter()
            try:
                await prune(
                    aclient[DB].harel_executions,
                    OLD + n,
                    batch_size=BATCH,
                    on_batch=lambda r: marks.append((time.perf_counter() - t0, r.removed)),
                    stop_after_batches=most // BATCH,
                )
            finally:
                await aclient.close()

        asyncio.run(pruned())
        store.close()
        seconds, removed = marks[-1]
        kind = "one round trip per execution" if old_marks else "one bulk write per partition"
        print(f"prune ({kind}): {removed:,} removed in {seconds:.1f} s, {removed / seconds:.0f}/s", flush=True)


def _rate(what: str, most: int, write: Any) -> None:
    t = time.perf_counter()
    for i in range(0, most, BATCH):
        write([f"x{j:07d}" for j in range(i, min(i + BATCH, most))])
    seconds = time.perf_counter() - t
    print(f"{what}: {most:,} in {seconds:.1f} s, {most / seconds:.0f}/s", flush=True)


def ceiling(n: int, most: int) -> None:
    """Bare deletes and marks by `_id`, 500 a command, with every index and with `_id` only."""
    with EmbeddedServer() as server:
        _, store, exes, rows = _seeded(server.url, n)
        for indexes in ("the store's indexes", "`_id` only"):
            if indexes == "`_id` only":
                exes.drop_indexes()
            count = len(exes.index_information())
            _reload(exes, rows)
            _rate(
                f"bare update_many, a mark ({indexes}: {count})",
                most,
                lambda ids: exes.update_many({"_id": {"$in": ids}}, {"$set": {"leaving": True}}),
            )
            _rate(f"bare delete_many ({indexes}: {count})", most, lambda ids: exes.delete_many({"_id": {"$in": ids}}))
        store.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("n", type=int, help="executions stored")
    p.add_argument("most", type=int, help="executions pruned at most (whole batches of 500)")
    p.add_argument("--old-marks", action="store_true", help="the fold's marks one round trip each, as before")
    p.add_argument("--ceiling", action="store_true", help="bare deletes and marks by _id instead: this server's bound")
    a = p.parse_args()
    if a.ceiling:
        ceiling(a.n, a.most)
    else:
        run(a.n, a.most, a.old_marks)


if __name__ == "__main__":
    main()
