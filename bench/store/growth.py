"""A database in use: finished executions, shaped as each store writes them, for the "stored"
measurements. The template is one Parcel driven to DONE by harel's engine on that store, so
neither store is measured against documents it would not have written itself."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pymongo
from harel.definition.model import Definition
from harel.engine.durable import DurableRunner
from harel.engine.execution import Execution, Status
from harel.spec.states import Event

from bench.common.harness import EXECUTIONS, STEPS, sync_store

# --- a database in use: finished executions, shaped as each store writes them ----------------


def finished_template(kind: str, url: str, defs: dict[str, Definition]) -> dict[str, Any]:
    """The document `kind`'s store leaves for a finished Parcel, written by harel's engine."""
    db = "hbbench_tpl_" + uuid.uuid4().hex[:6]
    store = sync_store(kind, url, db)
    runner = DurableRunner(store, defs)
    exe = runner.create("Parcel")
    for step in STEPS:
        runner.process(exe.id, Event(kind=step))
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    doc = client[db][EXECUTIONS].find_one({"_id": exe.id})
    assert doc is not None and Execution.model_validate_json(doc["data"]).status is Status.DONE
    client.drop_database(db)
    client.close()
    store.close()
    return doc


def seed(kind: str, url: str, db: str, n: int, template: dict[str, Any]) -> float:
    """`n` copies of a finished execution under new ids; the store's own set-up first (for
    this package: its indexes), then insert_many. Returns the seconds it took."""
    t = time.perf_counter()
    store = sync_store(kind, url, db)
    old = template["_id"]
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    coll = client[db][EXECUTIONS]
    batch = []
    for _ in range(n):
        new = uuid.uuid4().hex
        batch.append({**template, "_id": new, "data": template["data"].replace(old, new)})
        if len(batch) == 2_000:
            coll.insert_many(batch, ordered=False)
            batch = []
    if batch:
        coll.insert_many(batch, ordered=False)
    assert coll.count_documents({}) == n
    client.close()
    store.close()
    return time.perf_counter() - t
