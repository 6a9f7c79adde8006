"""A database holding every kind of document the store can hold, for the tests of the views.

The queries, `harel-beanie status`, `/metrics` and every dashboard page must read all of them:
- ordinary executions (a root, its children, FAILED, RUNNING and silent, DONE), with pending
  outbox entries and spawns and armed timers;
- executions whose ids are what an upstream system may name them: empty, `/`, `?`, `#`, `%`,
  `..`, spaces, quotes, backslashes, markup and script, `$`-prefixed, any unicode, very long;
- a purged execution's tombstone (a document holding only `_id` and `tomb`);
- (`seed_harel_layout`) a database harel's own MongoStore wrote, not yet migrated: no summary
  fields, no `pending` flag or `next_fire` bound, harel's timer keys, spawn contexts as dicts;
- an execution of a definition no registry knows;
- the largest execution the store accepts (its JSON just under the document budget).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pymongo
from harel.engine.execution import Execution, Status
from harel.engine.store.base import TimerOp
from harel.engine.store.mongo import MongoStore as HarelMongoStore
from harel.spec.states import Event

from harel_beanie.core.sizes import data_budget

#: ids an upstream system may give an execution: every one is listed, linked, opened, acted on
HOSTILE_IDS = [
    "",
    "a/b",
    "/leading",
    "trailing/",
    "..",
    "../x",
    "q?x=1",
    "h#frag",
    "p%41%2F%25",
    " spaced id ",
    "   ",
    "quote'single",
    'quote"double',
    "back\\slash",
    "q');alert(1);('",
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "{{7*7}}",
    "[red]markup[/red] [/]",
    "$gt",
    "$where",
    "日本語の注文",
    "e\u0301\u200b\ufeff🙂",
    "tab\there\nnewline",
    "nul\x00char",
    "L" * 1500,
]

NOW = time.time()


@dataclass
class Seeded:
    """What was seeded, for the tests to check the views against."""

    executions: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> definition, status
    purged: list[str] = field(default_factory=list)
    largest: str = "largest"
    unknown_definition: str = "NoSuchMachine"


def _exe(i: str, definition: str, status: Status, **kw: Any) -> Execution:
    return Execution(id=i, definition_id=definition, status=status, updated_at=NOW - 3600, **kw)


async def seed_everything(astore: Any, mongo_url: str, db_name: str, *, largest: bool = True) -> Seeded:
    """Seed `astore`'s database (default prefix) with every kind of document above."""
    out = Seeded()

    async def save(exe: Execution, **commit: Any) -> None:
        await astore.commit(exe, [], **commit) if commit else await astore.save(exe)
        out.executions[exe.id] = {"definition_id": exe.definition_id, "status": exe.status.value}

    # ordinary work: a root with pending work, its children, a failed one, a silent one
    root = _exe("order-1", "Order", Status.RUNNING, active_path="Paying")
    await astore.commit(
        root,
        [("order-1:Pay:0", Event(kind="Charge", data={"amount": 5}))],
        timers=(TimerOp("schedule", "Paying.Timeout", NOW + 600), TimerOp("schedule", "Due", NOW - 60)),
        spawns=(("order-1:Pick:0", "Picking", {"sku": "A"}),),
        trace={"event_kind": "Start", "from_path": None, "to_path": "Paying", "timestamp": NOW - 3600},
    )
    out.executions[root.id] = {"definition_id": "Order", "status": "RUNNING"}
    await save(_exe("order-1:Pay:0", "Payment", Status.DONE, parent_id="order-1", outcome="paid"))
    await save(_exe("failed-1", "Order", Status.FAILED, error="gateway answered 502"))
    await save(_exe("done-1", "Order", Status.DONE, outcome="shipped", finished_at=NOW - 7200))
    # ids an upstream system named; children of one of them
    for n, i in enumerate(HOSTILE_IDS):
        status = (Status.RUNNING, Status.FAILED, Status.DONE)[n % 3]
        await save(_exe(i, "Hostile", status, active_path="A.B", context={"id": i, "note": "<b>x</b>"}))
    await save(_exe("a/b:Kid:0", "Hostile", Status.RUNNING, parent_id="a/b"))
    await save(_exe("q');alert(1);(':Kid:0", "Hostile", Status.FAILED, parent_id="q');alert(1);('"))
    # a definition no registry knows
    await save(_exe("stray-1", out.unknown_definition, Status.RUNNING))
    # tombstones
    for i in ("purged-1", "purged/2"):
        exe = _exe(i, "Order", Status.DONE, finished_at=NOW - 9000)
        await astore.save(exe)
        stored = await astore.load(i)
        assert stored is not None and await astore.purge(i, stored.version)
        out.purged.append(i)
    if largest:
        s = astore.settings
        budget = data_budget(s.trace_max, s.trace_step_bytes, s.dedupe_window)
        await save(_exe(out.largest, "Order", Status.RUNNING, context={"blob": "z" * (budget - 8192)}))
    return out


def seed_harel_layout(mongo_url: str, db_name: str) -> dict[str, dict[str, Any]]:
    """A database written by harel's own MongoStore only (what `migrate up` adopts): roots and
    children in every status, pending outbox entries and spawns, armed timers (one due)."""
    harel = HarelMongoStore(pymongo.MongoClient(mongo_url), db_name)
    out: dict[str, dict[str, Any]] = {}
    try:

        def put(exe: Execution, **commit: Any) -> None:
            harel.commit(exe, [], **commit)
            out[exe.id] = {"definition_id": exe.definition_id, "status": exe.status.value}

        put(
            _exe("legacy-1", "Order", Status.SUSPENDED, active_path="Waiting"),
            timers=(TimerOp("schedule", "Waiting.Nudge", NOW + 60), TimerOp("schedule", "Late", NOW - 60)),
        )
        put(_exe("legacy/2", "Legacy", Status.FAILED, error="boom"), spawns=(("legacy/2:R:0", "R", {"k": "v"}),))
        put(_exe("legacy/2:R:0", "R", Status.RUNNING, parent_id="legacy/2"))
        put(_exe("legacy-3", "Order", Status.DONE, outcome="shipped", finished_at=NOW - 60))
        harel.commit(_exe("legacy-4", "Order", Status.RUNNING), [("legacy-1", Event(kind="Ping"))])
        out["legacy-4"] = {"definition_id": "Order", "status": "RUNNING"}
    finally:
        harel._client.close()
    return out
