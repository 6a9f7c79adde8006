"""Would group commit win? The same state-only commits sent one update each, concurrently (what
harel's AsyncWorker does with `--concurrency` events in flight), and as one unordered bulk
write (what a group commit would send), on the embedded server, with the store's indexes.

Why this exists: issue #39 asks for group commit only if the figures say it wins. A group
commit saves round trips, not server work: each update in a bulk write still matches its
document by `_id`, checks its version and maintains every index the document is in. This
measures that trade directly, without building the batching first: the updates have the
shape of the store's state-only commit (a conditional `$set` of the snapshot, version,
`updated_at` and a pushed commit token), on documents the store itself created.

    .venv/bin/python -m bench.store.group_commit [--docs 64] [--rounds 30] [--url URL]

It writes its section of bench/RESULTS.md ("group-commit").
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import json
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import pymongo
from harel.engine.execution import Execution, Status
from pymongo import UpdateOne

from bench.common.harness import machine, on_one_server, one_server_options
from bench.common.sections import splice
from harel_beanie import AsyncMongoStore

DB = "bench_group_commit"
#: what the figures decided (issue #39 keeps group commit only if it wins), said under them
VERDICT = (
    "Group commit is not built: on this server one bulk write of the same updates is no faster "
    "than the updates sent concurrently, and slower as more are ready together (likely because a "
    "bulk write's updates run one after another inside one command, while concurrent single "
    "updates overlap their round trips with the server's work). It saves round trips, not the "
    "per-update work this server spends (every index maintained), which is what a commit costs "
    "here (the index figures earlier in this file)."
)


async def _seed(url: str, n: int) -> list[str]:
    store = AsyncMongoStore(pymongo.AsyncMongoClient(url), DB)
    await store.init()
    ids = [f"g{i:04d}" for i in range(n)]
    now = time.time()
    for i in ids:
        exe = Execution(
            id=i, definition_id="Cycle", status=Status.RUNNING, active_path="A", created_at=now, updated_at=now
        )
        await store.commit(exe, [])
    await store.close()
    return ids


def _update(eid: str, version: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A state-only commit's update: conditional on the version, the snapshot and version set."""
    data = json.dumps({"status": "RUNNING", "active_path": "B" if version % 2 else "A", "context": {"n": version}})
    return (
        {"_id": eid, "version": version},
        {
            "$set": {"version": version + 1, "data": data, "active_path": "B", "updated_at": time.time()},
            "$push": {"commit_tokens": {"$each": [uuid.uuid4().hex], "$slice": -8}},
        },
    )


async def measure(url: str, docs: int, rounds: int) -> dict[str, Any]:
    ids = await _seed(url, docs)
    client: Any = pymongo.AsyncMongoClient(url)
    coll = client[DB]["harel_executions"]
    versions = {d["_id"]: d["version"] for d in await coll.find({"_id": {"$in": ids}}, {"version": 1}).to_list(None)}
    single: list[float] = []
    bulk: list[float] = []
    for r in range(rounds):
        # alternate which goes first, so neither always meets a warmer cache
        for way in ("single", "bulk") if r % 2 == 0 else ("bulk", "single"):
            ops = [_update(i, versions[i]) for i in ids]
            started = time.perf_counter()
            if way == "single":
                results = await asyncio.gather(*(coll.update_one(f, u) for f, u in ops))
                matched = sum(x.matched_count for x in results)
            else:
                matched = (await coll.bulk_write([UpdateOne(f, u) for f, u in ops], ordered=False)).matched_count
            (single if way == "single" else bulk).append((time.perf_counter() - started) * 1000)
            assert matched == len(ids), (way, matched)
            for i in ids:
                versions[i] += 1
    await client.close()
    one, many = statistics.median(single), statistics.median(bulk)
    return {
        "docs": docs,
        "rounds": rounds,
        "single_ms": one,
        "bulk_ms": many,
        "single_per_s": docs / one * 1000,
        "bulk_per_s": docs / many * 1000,
        "ratio": one / many,
    }


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=64, help="commits ready together (default 64)")
    p.add_argument("--rounds", type=int, default=30, help="timed rounds of each way (default 30)")
    one_server_options(p)
    a = p.parse_args(argv)
    load = os.getloadavg()
    rows = []
    for docs in sorted({1, 4, 16, a.docs}):
        out = on_one_server(a.url, lambda url: asyncio.run(measure(url, docs, a.rounds)))
        print(
            f"{docs:>3} commits ready together: one update each {out['single_ms']:.1f} ms "
            f"({out['single_per_s']:,.0f}/s), one bulk write {out['bulk_ms']:.1f} ms "
            f"({out['bulk_per_s']:,.0f}/s): bulk {out['ratio']:.2f}x"
        )
        rows.append(
            f"| {docs} | {out['single_ms']:.1f} | {out['bulk_ms']:.1f} | {out['single_per_s']:,.0f} "
            f"| {out['bulk_per_s']:,.0f} | {out['ratio']:.2f}x |"
        )
    m = machine()
    where = "the server at --url" if a.url else f"SecantusDB {importlib.metadata.version('secantusdb')} (embedded)"
    body = [
        "## Group commit: one bulk write against one update each",
        "",
        f"{datetime.date.today()}, {where}, {m['cpus']} x {m['cpu']}, Python {m['python']}, "
        f"PyMongo {m['pymongo']}; load average {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f} at the start. "
        f"`python -m bench.store.group_commit --rounds {a.rounds}`: the same state-only commits (a conditional update "
        "by `_id` and version, the store's indexes in place), sent concurrently one update each, as "
        "harel's AsyncWorker sends them, and as one unordered bulk write, as a group commit would; "
        "medians of the rounds, the two ways alternating.",
        "",
        "| commits ready together | one update each (ms) | one bulk write (ms) | one each (/s) | bulk (/s) "
        "| bulk against one each |",
        "|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        VERDICT,
    ]
    splice(Path(a.out), "group-commit", "\n".join(body))
    print(f"written to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
