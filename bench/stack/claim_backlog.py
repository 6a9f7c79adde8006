"""A claim with a backlog queued, and a backlog drained by one worker's claims, on the
embedded server: what `transport/claim_walk.py` and `transport/prefetch.py` are for.

    python -m bench.stack.claim_backlog [--groups 10000] [--claims 30] [--drain-seconds 120]

- claim: `groups` groups of one message each published (one publish each), then `claims`
  claims of one group, each timed alone (its ack after, not timed); the first claim of the
  process is shown apart (with no start kept it reads the due groups whole, once);
- drain: `groups` messages published again to a fresh database, then one worker's loop of
  claim and ack (`AsyncMongoTransport`, harel's AsyncWorker's calls, no handler: the
  transport's share of a worker's time) until nothing is claimable or `drain-seconds` pass,
  without prefetch and with it (`prefetch=32`, as `harel-beanie worker` sets it).

To measure the code before a change, run this file with that code first on the path
(`PYTHONPATH=<checkout>/src`): it uses only the transport's public calls, and skips prefetch
where the transport has none. Wall-clock figures of one machine: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import inspect
import json
import os
import statistics
import time
from typing import Any

import pymongo
from harel.spec.states import Event

from harel_beanie.deploy.embedded import EmbeddedServer
from harel_beanie.transport import AsyncMongoTransport, MongoTransport


def _publish(t: MongoTransport, n: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        t.publish(f"g{i:05d}", Event(kind="e", data={"i": i}))
    return n / (time.perf_counter() - started)


def claim_figures(url: str, groups: int, claims: int) -> dict[str, Any]:
    client: Any = pymongo.MongoClient(url)
    t = MongoTransport(client, "bench_claim")
    rate = _publish(t, groups)
    started = time.perf_counter()
    lease = t.claim("w", 60.0)
    first = time.perf_counter() - started
    assert lease is not None
    t.ack(lease)
    times = []
    for _ in range(claims):
        started = time.perf_counter()
        lease = t.claim("w", 60.0)
        times.append(time.perf_counter() - started)
        assert lease is not None
        t.ack(lease)
    t.close()
    ms = sorted(x * 1000 for x in times)
    return {
        "publish_per_s": round(rate, 1),
        "first_claim_ms": round(first * 1000, 1),
        "claim_ms_median": round(statistics.median(ms), 2),
        "claim_ms_p90": round(ms[int(0.9 * (len(ms) - 1))], 2),
        "claim_ms_max": round(ms[-1], 2),
    }


async def _drain(url: str, db: str, prefetch: int, seconds: float) -> tuple[int, float]:
    options: dict[str, Any] = (
        {"prefetch": prefetch} if "prefetch" in inspect.signature(AsyncMongoTransport).parameters else {}
    )
    t = AsyncMongoTransport(pymongo.AsyncMongoClient(url), db, **options)
    done = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        lease = await t.claim("w", 60.0)
        if lease is None:
            break
        await t.ack(lease)
        done += 1
    elapsed = time.perf_counter() - started
    await t.close()
    return done, elapsed


def drain_figures(url: str, groups: int, prefetch: int, seconds: float, run: int) -> dict[str, Any]:
    db = f"bench_drain_{run}"
    _publish(MongoTransport(pymongo.MongoClient(url), db), groups)
    done, elapsed = asyncio.run(_drain(url, db, prefetch, seconds))
    return {"prefetch": prefetch, "drained": done, "seconds": round(elapsed, 1), "per_s": round(done / elapsed, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=10_000)
    ap.add_argument("--claims", type=int, default=30)
    ap.add_argument("--drain-seconds", type=float, default=120.0)
    args = ap.parse_args()
    load = os.getloadavg()
    with EmbeddedServer() as server:
        out: dict[str, Any] = {
            "server": f"SecantusDB {importlib.metadata.version('secantusdb')} (embedded, standalone)",
            "groups": args.groups,
            "claim": claim_figures(server.url, args.groups, args.claims),
        }
        prefetches = [1, 32] if "prefetch" in inspect.signature(AsyncMongoTransport).parameters else [1]
        out["drain"] = [drain_figures(server.url, args.groups, k, args.drain_seconds, k) for k in prefetches]
    out["load_before_after"] = [round(x, 2) for x in (*load, *os.getloadavg())]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
