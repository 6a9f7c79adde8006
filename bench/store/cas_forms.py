"""Where a commit's compare-and-set is checked: in the update's filter (what the store sends) or
inside a pipeline update matched by `_id` alone. Issue #39's "what was tried" for the commit.

Why this exists: on the embedded server (SecantusDB) a commit with the store's indexes costs
several times harel's, and a probe found that any predicate beside `_id` in an update's filter
costs on its own (the server plans such a filter over every index; a filter of `_id` alone
takes its fast path). The same compare-and-set can be written with `_id` alone in the filter
and the checks moved into the update: a pipeline whose every field is `$cond` on the checks,
so a stale commit rewrites each field with its own value and the server reports nothing
modified. This measures the three forms on the same documents, with the store's indexes:

- the filter as the store sends it (the version, a pinned commit's pins, in point form);
- the same update by `_id` alone: no check at all, the floor (not a commit: never safe);
- the checks inside a pipeline matched by `_id` (`pipeline_cas` below).

Each form's update is the one the store itself sent for a real pinned state-only commit of
that document (captured on the wire), replayed at the document's current version. Before it
times anything, it checks that the pipeline form writes the same document as the filter form
and that a stale one modifies nothing.

    .venv/bin/python -m bench.store.cas_forms [--docs 200] [--rounds 7] [--url URL]

It writes its section of bench/RESULTS.md ("cas-forms").
"""

from __future__ import annotations

import argparse
import copy
import datetime
import importlib.metadata
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import pymongo
from harel.engine.execution import Execution, Status
from harel.engine.store.base import Step
from pymongo import monitoring

from bench.common.harness import machine, on_one_server, one_server_options
from bench.common.sections import splice
from harel_beanie import MongoStore

DB = "bench_cas_forms"
COLL = "harel_executions"
FORMS = ("filter (as sent)", "`_id` alone, no check (floor)", "pipeline, checks inside")


def verdict(ms: list[float]) -> str:
    """What the figures decided, said under them."""
    filt, floor, pipe = ms
    return (
        f"Not adopted. Here the pipeline form saves {filt - pipe:.2f} ms of the filter form's {filt:.2f} ms "
        f"(with no check at all, {filt - floor:.2f} ms): the filter's predicates do cost on this server. "
        "But it would change what every commit is on every server, for a saving on one: the update "
        "becomes expressions evaluated over the whole document (mongod then rewrites the document and "
        "diffs it for the oplog, where an operator update writes only its fields); a refused commit "
        "matches its document anyway, so the refusal is read from `nModified` instead of the match; "
        "every value must be wrapped as a literal; and mongomock, the in-memory layer, refuses this "
        "pipeline (it has no `$type` expression), so the filter form would stay beside it, two forms of the one write every proof of the counts "
        "rests on (core/counting.py). The saving does not close the gap to harel's store on this "
        "server (the events/s tables earlier in this file), so the store keeps the filter form."
    )


class _Capture(monitoring.CommandListener):
    """The last `update` command sent: the store's own commit, as it went on the wire."""

    def __init__(self) -> None:
        self.last: Optional[dict[str, Any]] = None

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "update":
            self.last = copy.deepcopy(event.command["updates"][0])

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def _check(field: str, want: Any) -> dict[str, Any]:
    """One filter predicate of the store's commit as an aggregation expression."""
    if isinstance(want, dict) and set(want) == {"$in"} and len(want["$in"]) == 1:
        return {"$eq": [f"${field}", {"$literal": want["$in"][0]}]}
    if isinstance(want, dict) and set(want) == {"$exists"}:
        missing = {"$eq": [{"$type": f"${field}"}, "missing"]}
        return {"$not": [missing]} if want["$exists"] else missing
    if isinstance(want, dict) and set(want) == {"$not"} and set(want["$not"]) == {"$gte"}:
        return {"$not": [{"$gte": [f"${field}", want["$not"]["$gte"]]}]}
    if isinstance(want, dict):
        raise ValueError(f"no expression for {field}: {want!r}")
    return {"$eq": [f"${field}", {"$literal": want}]}


def pipeline_cas(flt: dict[str, Any], update: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The commit `(flt, update)` as a filter of `_id` alone and a pipeline that applies the
    update only where every other predicate of `flt` holds, field by field."""
    ok = {"$and": [_check(k, v) for k, v in flt.items() if k != "_id"]}
    new: dict[str, Any] = {}
    for op, fields in update.items():
        for f, v in fields.items():
            if op == "$set":
                new[f] = {"$literal": v}
            elif op == "$unset":
                new[f] = "$$REMOVE"
            elif op == "$push":
                items = v["$each"] if isinstance(v, dict) else [v]
                joined: Any = {"$concatArrays": [{"$ifNull": [f"${f}", []]}, {"$literal": items}]}
                new[f] = {"$slice": [joined, v["$slice"]]} if isinstance(v, dict) and "$slice" in v else joined
            elif op == "$inc":
                new[f] = {"$add": [{"$ifNull": [f"${f}", 0]}, v]}
            elif op in ("$min", "$max"):
                new[f] = {op: [f"${f}", {"$literal": v}]}
            else:
                raise ValueError(f"no expression for {op}")
    fields = {f: {"$cond": ["$__ok", value, f"${f}"]} for f, value in new.items()}
    return {"_id": flt["_id"]}, [{"$set": {"__ok": ok}}, {"$set": fields}, {"$unset": "__ok"}]


def _at(flt: dict[str, Any], update: dict[str, Any], version: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The captured commit replayed at `version`: the filter's version and the new one moved."""
    flt, update = copy.deepcopy(flt), copy.deepcopy(update)
    flt["version"] = {"$in": [version]}
    update["$set"]["version"] = version + 1
    update["$push"]["commit_tokens"]["$each"] = [uuid.uuid4().hex]
    return flt, update


def _send(coll: Any, form: int, flt: dict[str, Any], update: dict[str, Any]) -> int:
    if form == 0:
        return int(coll.update_one(flt, update).modified_count)
    if form == 1:
        return int(coll.update_one({"_id": flt["_id"]}, update).modified_count)
    by_id, pipeline = pipeline_cas(flt, update)
    return int(coll.update_one(by_id, pipeline).modified_count)


def _seed(url: str, docs: int) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """`docs` executions the store made, each with the update of one pinned state-only commit
    the store sent for it (its dedupe window filled first, so the arrays keep their size)."""
    listener = _Capture()
    store = MongoStore(pymongo.MongoClient(url, event_listeners=[listener]), DB, dedupe_window=20)
    store.init()
    captured: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for i in range(docs):
        exe = Execution(id=f"c{i:05d}", definition_id="Cycle", status=Status.RUNNING, active_path="A")
        store.commit(exe, [])
        for n in range(22):
            step = Step(cause="event", from_status=Status.RUNNING, to_status=Status.RUNNING, event_kind="Tick")
            exe.active_path = "B" if n % 2 else "A"
            store.commit(exe, [], processed_event_id=uuid.uuid4().hex, step=step)
        sent = listener.last
        assert sent is not None and "status" in sent["q"], "not a pinned commit"  # the pins are in the filter
        captured[exe.id] = (sent["q"], sent["u"])
    store.close()
    return captured


def measure(url: str, docs: int, rounds: int) -> dict[str, Any]:
    captured = _seed(url, docs)
    client: Any = pymongo.MongoClient(url)
    coll = client[DB][COLL]
    versions = {d["_id"]: d["version"] for d in coll.find({}, {"version": 1})}
    ids = sorted(captured)

    # the pipeline writes what the filter form writes (the same commit sent both ways, on the
    # document and on a copy of it taken before), and a stale one writes nothing
    eid = ids[0]
    copy_of = client[DB]["cas_forms_copy"]
    copy_of.insert_one(coll.find_one({"_id": eid}))
    commit = _at(*captured[eid], versions[eid])
    assert _send(copy_of, 0, *commit) == 1 and _send(coll, 2, *commit) == 1
    versions[eid] += 1
    assert coll.find_one({"_id": eid}) == copy_of.find_one({"_id": eid})
    before = coll.find_one({"_id": eid})
    assert _send(coll, 2, *_at(*captured[eid], versions[eid] - 1)) == 0
    assert coll.find_one({"_id": eid}) == before

    times: list[list[float]] = [[], [], []]
    for r in range(rounds):
        order = [(r + k) % 3 for k in range(3)]  # each form goes first in turn
        for form in order:
            started = time.perf_counter()
            for eid in ids:
                assert _send(coll, form, *_at(*captured[eid], versions[eid])) == 1
                versions[eid] += 1
            times[form].append((time.perf_counter() - started) / len(ids) * 1000)
    client.close()
    return {"ms": [statistics.median(t) for t in times], "filter": captured[ids[0]][0]}


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=200, help="executions, each committed once per round and form")
    p.add_argument("--rounds", type=int, default=7, help="timed rounds of each form (default 7)")
    one_server_options(p)
    a = p.parse_args(argv)
    load = os.getloadavg()
    out = on_one_server(a.url, lambda url: measure(url, a.docs, a.rounds))
    ms = out["ms"]
    for name, t in zip(FORMS, ms):
        print(f"{name}: {t:.2f} ms a commit")
    shape = ", ".join(f"`{k}`" for k in out["filter"])
    m = machine()
    where = "the server at --url" if a.url else f"SecantusDB {importlib.metadata.version('secantusdb')} (embedded)"
    body = [
        "## A commit's compare-and-set: in the filter or inside the update",
        "",
        f"{datetime.date.today()}, {where}, {m['cpus']} x {m['cpu']}, Python {m['python']}, "
        f"PyMongo {m['pymongo']}; load average {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f} at the start. "
        f"`python -m bench.store.cas_forms --docs {a.docs} --rounds {a.rounds}`: the update the store sent "
        f"for a pinned state-only commit of each of {a.docs} executions (its filter names {shape}), replayed "
        "at each document's version in three forms, the store's indexes in place; ms a commit, medians of "
        "the rounds, each form first in turn. The pipeline form was checked first to write the same document "
        "as the filter form, and to modify nothing when stale.",
        "",
        "| form | ms a commit | against the filter |",
        "|---|---:|---:|",
        *(f"| {name} | {t:.2f} | {t / ms[0]:.2f}x |" for name, t in zip(FORMS, ms)),
        "",
        verdict(ms),
    ]
    splice(Path(a.out), "cas-forms", "\n".join(body))
    print(f"written to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
