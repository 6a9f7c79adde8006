"""What the index set costs a commit: each commit kind timed on collections holding every index,
none, or all but one (and on harel's store), and the index keys each kind writes, counted from
the documents as the store leaves them. The store is driven directly, without the engine, so
the differences between the variants are the indexes' own.

Part of `make bench` (bench/store/run.py); run alone, on the embedded server, it writes the figures
docs/INDEXES.md shows (bench/store/indexes.json; tests/store/test_index_use.py renders the page):

    python -m bench.store.indexes [--commits 40] [--blocks 12]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

import pymongo
from harel.engine.execution import Execution, Status
from harel.engine.store.base import TimerOp
from harel.engine.store.mongo import MongoStore as HarelMongoStore
from harel.spec.states import Event

from bench.common.harness import EXECUTIONS, machine, server_info
from harel_beanie import MongoStore
from harel_beanie.core.documents import ExecutionDocument, index_models
from harel_beanie.deploy.embedded import EmbeddedServer

#: what `python -m bench.store.indexes` writes: the figures docs/INDEXES.md shows
FIGURES = Path(__file__).resolve().parent / "indexes.json"

# --- what each index costs a commit ---------------------------------------------------------


#: the commit kinds the per-commit table measures, and what each operation does
COMMIT_KINDS = {
    "create": "the first commit of a new execution (an insert)",
    "state": "a state-only commit (what an event costs)",
    "trace": "a state-only commit with a trace step",
    "emit": "a commit with one emit, then its ack",
    "spawn": "a commit with one spawn, then its ack",
    "timer": "a commit arming a timer, then the timer's delete",
}


class _Variant:
    """A store on a collection holding exactly `indexes` (plus `_id`), with one running
    execution whose dedupe window is already full, so every block measures the same work."""

    WINDOW = 100  # a short window, filled in the warm-up: array sizes stay constant

    def __init__(self, url: str, indexes: list[Any], harel: bool = False) -> None:
        self.db = "hbbench_ix_" + uuid.uuid4().hex[:6]
        self.client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
        self.coll = self.client[self.db][EXECUTIONS]
        if indexes:
            self.coll.create_indexes(indexes)
        self.store: Any
        if harel:  # the reference: harel's own store (its dedupe set is not a window: it grows)
            self.store = HarelMongoStore(pymongo.MongoClient(url), self.db)
        else:
            self.store = MongoStore(pymongo.MongoClient(url), self.db, create_schema=False, dedupe_window=self.WINDOW)
            self.store.init()
        self.made: list[str] = []  # executions the "create" operations made
        self.exe = Execution(definition_id="Parcel", status=Status.RUNNING, active_path="Ordered")
        self.store.commit(self.exe, [])
        for _ in range(self.WINDOW + 10):
            self.store.commit(self.exe, [], processed_event_id=uuid.uuid4().hex)

    def op(self, kind: str, record: Optional[Callable[[], None]] = None) -> None:
        """One operation of `kind`; `record()` is called after each write it makes (the
        per-commit table reads the document there to count index keys)."""
        note = record or (lambda: None)
        exe, store = self.exe, self.store
        exe.updated_at = time.time()  # as harel's engine stamps every commit
        if kind == "create":
            fresh = Execution(definition_id="Parcel", status=Status.PENDING, active_path="Ordered")
            store.commit(fresh, [], processed_event_id=uuid.uuid4().hex)
            self.created = fresh.id
            self.made.append(fresh.id)
            note()
        elif kind in ("state", "trace"):
            trace = {"cause": "event", "event_kind": "Pay", "to_path": "Paid"} if kind == "trace" else None
            store.commit(exe, [], processed_event_id=uuid.uuid4().hex, trace=trace)
            note()
        elif kind == "emit":
            seqs = store.commit(exe, [(exe.id, Event(kind="Pay"))], processed_event_id=uuid.uuid4().hex)
            note()
            store.ack_outbox(seqs[0])
            note()
        elif kind == "spawn":
            child = f"{exe.id}:Fork.A:{uuid.uuid4().hex[:6]}"
            store.commit(exe, [], processed_event_id=uuid.uuid4().hex, spawns=((child, "Fork.A", {"n": 1}),))
            note()
            [entry] = [e for e in store.pending_spawns() if e.child_id == child]
            store.ack_spawn(entry.seq)
            note()
        elif kind == "timer":
            at = time.time() + 3600.0
            store.commit(exe, [], processed_event_id=uuid.uuid4().hex, timers=(TimerOp("schedule", "Ordered", at),))
            note()
            store.delete_timer(exe.id, "Ordered", at)
            note()
        else:
            raise ValueError(kind)

    def block(self, commits: int) -> dict[str, float]:
        """ms per operation of each kind."""
        out = {}
        for kind in COMMIT_KINDS:
            n = commits if kind in ("state", "trace", "create") else max(1, commits // 2)
            t = time.perf_counter()
            for _ in range(n):
                self.op(kind)
            out[kind] = (time.perf_counter() - t) / n * 1000
            if self.made:  # untimed: the collection keeps one execution for every block
                self.coll.delete_many({"_id": {"$in": self.made}})
                self.made.clear()
        return out

    def close(self) -> None:
        self.store.close()
        self.client.drop_database(self.db)
        self.client.close()


def index_costs(url: str, commits: int, blocks: int) -> dict[str, dict[str, float]]:
    """Per variant (every index, none, all but one), ms per operation of each commit kind; and
    per index, what it adds: the median over blocks of (all - all but it), the two measured
    back to back in the same block (the order turning each block), so drift and the
    machine's other load cancel."""
    declared = index_models(ExecutionDocument)
    names = [ix.document["name"] for ix in declared]
    variants = {"all": _Variant(url, declared), "none": _Variant(url, []), "harel": _Variant(url, [], harel=True)}
    for name in names:
        variants[f"-{name}"] = _Variant(url, [ix for ix in declared if ix.document["name"] != name])
    keys = list(variants)
    per: dict[str, list[dict[str, float]]] = {k: [] for k in keys}
    try:
        for b in range(blocks):
            order = keys[b % len(keys) :] + keys[: b % len(keys)]
            if b % 2:
                order.reverse()
            for k in order:
                per[k].append(variants[k].block(commits))
    finally:
        for v in variants.values():
            v.close()
    out: dict[str, dict[str, float]] = {}
    for k in keys:
        out[k] = {kind: statistics.median(x[kind] for x in per[k]) for kind in COMMIT_KINDS}
    for k in keys:
        if k.startswith("-"):
            out["cost" + k] = {
                kind: statistics.median(a[kind] - m[kind] for a, m in zip(per["all"], per[k])) for kind in COMMIT_KINDS
            }
    out["cost_all"] = {
        kind: statistics.median(a[kind] - m[kind] for a, m in zip(per["all"], per["none"])) for kind in COMMIT_KINDS
    }
    return out


# --- index keys each commit kind writes ---------------------------------------------------------


def _path_values(doc: Any, path: str) -> list[Any]:
    """The values an index key on `path` takes in `doc` (arrays fan out; an empty array is
    one key, a missing field one null key), as MongoDB indexes them."""
    head, _, rest = path.partition(".")
    value = doc.get(head, None) if isinstance(doc, dict) else None
    if isinstance(value, list):
        if not value:
            return ["<empty>"]
        return [v for item in value for v in (_path_values(item, rest) if rest else [item])]
    if rest:
        return _path_values(value, rest) if isinstance(value, dict) else [None]
    return [value]


def _partial_match(doc: dict[str, Any], pfe: dict[str, Any]) -> bool:
    """The partial filters this store declares: an equality, or a `$gte` bound."""
    for path, cond in pfe.items():
        values = [v for v in _path_values(doc, path) if v not in (None, "<empty>")]
        if isinstance(cond, dict):
            low = cond["$gte"]
            if not any(isinstance(v, (int, float)) and v >= low for v in values):
                return False
        elif cond not in values:
            return False
    return True


def index_keys(doc: Optional[dict[str, Any]], ix: Any) -> set[tuple[Any, ...]]:
    """The keys `doc` holds in index `ix` (an IndexModel)."""
    if doc is None:
        return set()
    spec = ix.document
    pfe = spec.get("partialFilterExpression")
    if pfe and not _partial_match(doc, pfe):
        return set()
    fields = list(dict(spec["key"]))
    if spec.get("sparse") and all(doc.get(f.split(".")[0]) is None for f in fields):
        return set()
    keys: list[tuple[Any, ...]] = [()]
    for f in fields:
        keys = [k + (repr(v),) for k in keys for v in _path_values(doc, f)]
    return set(keys)


def keys_written(url: str) -> dict[str, dict[str, tuple[int, int]]]:
    """For each commit kind and each declared index: (keys a server that rewrites every
    entry of a changed document writes - SecantusDB: every old entry removed, every new one
    added; keys a server that writes only what changed writes - mongod), summed over the
    kind's writes, read from the documents as the store left them after each write."""
    declared = index_models(ExecutionDocument)
    v = _Variant(url, declared)
    out: dict[str, dict[str, tuple[int, int]]] = {}
    try:
        for kind in COMMIT_KINDS:
            docs: list[Optional[dict[str, Any]]] = []
            target = [v.exe.id]

            def record() -> None:
                docs.append(v.coll.find_one({"_id": getattr(v, "created", None) if kind == "create" else target[0]}))

            before = None if kind == "create" else v.coll.find_one({"_id": v.exe.id})
            v.op(kind, record)
            out[kind] = {}
            for ix in declared:
                every = changed = 0
                prev = before
                for doc in docs:
                    old, new = index_keys(prev, ix), index_keys(doc, ix)
                    every += len(old) + len(new)
                    changed += len(old ^ new)
                    prev = doc
                out[kind][ix.document["name"]] = (every, changed)
    finally:
        v.close()
    return out


# --- the figures docs/INDEXES.md shows ------------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--commits", type=int, default=40, help="commits per variant and block (default 40)")
    p.add_argument("--blocks", type=int, default=12, help="blocks, the order turning each (default 12)")
    p.add_argument("--out", default=str(FIGURES), help="where to write (default bench/store/indexes.json)")
    a = p.parse_args(argv)
    started = time.time()
    with EmbeddedServer() as server:
        info = server_info("embedded", server.url)
        load = os.getloadavg()
        costs = index_costs(server.url, a.commits, a.blocks)
        keys = keys_written(server.url)
    when = datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    box = machine()
    run = (
        f"run {when} with `python -m bench.store.indexes --commits {a.commits} --blocks {a.blocks}` in "
        f"{(time.time() - started) / 60:.1f} min on {info['server']}, {box.get('cpus', '?')} CPUs shared "
        f"(load {load[0]:.2f} at the start)"
    )
    names = [ix.document["name"] for ix in index_models(ExecutionDocument)]
    out = {
        "run": run,
        "kinds": COMMIT_KINDS,
        "costs": {n: costs[f"cost-{n}"] for n in names},
        "keys": {n: {kind: list(keys[kind][n]) for kind in COMMIT_KINDS} for n in names},
        "every_index": costs["all"],
        "id_only": costs["none"],
    }
    Path(a.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(run, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
