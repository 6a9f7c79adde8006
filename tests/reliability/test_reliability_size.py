"""No execution wedged by what the store keeps for itself: the trace ring and the dedupe
window are bounded in bytes as well as in count, and a commit refused for the size of the
user's own data says what is too large and by how much.

Measured with harel's DurableRunner, tracing on (harel puts the whole context into every
trace step), on contexts from 1 kB to several MB, on the real server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import bson
import pymongo
import pytest
from harel import DurableRunner
from harel.engine.execution import Execution
from harel.spec.states import Event

from harel_beanie import ExecutionTooLarge, MongoStore
from harel_beanie.core.sizes import DEFAULT_TRACE_STEP_BYTES, MAX_DOCUMENT_BYTES, data_budget
from harel_beanie.deploy.loader import load_models

MODEL = """
event Note {}

machine Ledger {
  context { blob: string = ""  notes: int = 0 }
  initial Open
  state Open {}
  from Open to Open on Note set context.notes = context.notes + 1
}
"""


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("ledger")
    (folder / "ledger.stm").write_text(MODEL)
    return load_models(Path(folder))


def document_bytes(client: pymongo.MongoClient[Any], db_name: str, exe_id: str) -> int:
    return len(bson.encode(client[db_name]["harel_executions"].find_one({"_id": exe_id})))


@pytest.mark.parametrize("context_kb", [1, 100, 1024, 4096])
def test_a_traced_execution_with_a_large_context_keeps_committing(
    mongo_url, db_name, client, ledger, context_kb, figures
):
    """24 traced events on one execution whose context holds `context_kb` kB: every commit
    lands, the document stays under the server's limit (with a 4 MB context harel's store and
    this store before the byte bounds stopped after 3 events), and the trace keeps every
    step's small fields; a step too large keeps its context as `omitted_bytes`."""
    store = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    runner = DurableRunner(store, ledger, trace=True)
    exe = runner.create("Ledger", context={"blob": "x" * (context_kb * 1024)}, execution_id="big")
    events = 24
    for _ in range(events):
        runner.process(exe.id, Event(kind="Note"))
    assert store.load(exe.id).context["notes"] == events
    size = document_bytes(client, db_name, exe.id)
    assert size < MAX_DOCUMENT_BYTES
    steps = store.read_trace(exe.id)
    assert len(steps) == events + 1 and [s["index"] for s in steps] == list(range(events + 1))
    assert all(s["event_kind"] in ("Start", "Note") and "to_path" in s for s in steps)
    if context_kb * 1024 > DEFAULT_TRACE_STEP_BYTES:
        assert steps[-1]["context_out"] == {"omitted_bytes": pytest.approx(context_kb * 1024, rel=0.01)}
    else:
        assert steps[-1]["context_out"]["notes"] == events
    figures.set(context_bytes=context_kb * 1024, traced_events=events, document_bytes=size)
    store.close()


def test_the_trace_ring_is_bounded_in_bytes_whatever_the_steps(mongo_url, db_name, client, figures):
    """A full ring of the largest steps (each over the per-step bound) stays within
    `trace_max` x `trace_step_bytes`, and its document under the limit with room for the
    dedupe window."""
    store = MongoStore(pymongo.MongoClient(mongo_url), db_name, trace_max=40)
    exe = Execution(id="ring", definition_id="d")
    store.commit(exe, [])
    wide = {f"k{i}": "y" * 2000 for i in range(200)}  # 400 kB of small values: no single large one
    for i in range(60):
        store.append_trace(exe.id, {"i": i, **wide})
    doc = client[db_name]["harel_executions"].find_one({"_id": "ring"})
    assert len(doc["trace"]) == 40
    ring = len(bson.encode({"t": doc["trace"]}))
    assert ring <= 40 * (DEFAULT_TRACE_STEP_BYTES + 64)
    assert [s["i"] for s in store.read_trace("ring")] == list(range(20, 60))  # slimmed, still indexed
    figures.set(steps_kept=40, step_bytes_offered=len(str(wide)), ring_bytes=ring)
    store.close()


def test_long_event_ids_are_remembered_in_bounded_bytes(mongo_url, db_name, client, figures):
    """Event ids of 50 kB each: 400 of them would be 20 MB in the dedupe window (a wedged
    execution); a long id is remembered by its digest, and still recognised, as is one
    harel's store wrote whole."""
    store = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    exe = Execution(id="ids", definition_id="d")
    store.commit(exe, [])
    long_ids = [f"{i:04d}" + "e" * 50_000 for i in range(400)]
    for event_id in long_ids:
        store.commit(exe, [], processed_event_id=event_id)
    assert store.load_for_event("ids", long_ids[0]) == (store.load("ids"), True)
    assert store.is_processed("ids", long_ids[-1]) and not store.is_processed("ids", "0000" + "e" * 49_999)
    legacy = "L" + "e" * 50_000
    client[db_name]["harel_executions"].update_one({"_id": "ids"}, {"$push": {"processed": legacy}})
    assert store.is_processed("ids", legacy)  # harel's store kept the id itself
    size = document_bytes(client, db_name, "ids")
    assert size < 200_000
    figures.set(events=400, event_id_bytes=50_004, document_bytes=size)
    store.close()


def test_a_context_that_leaves_no_room_is_refused_up_front_naming_it(mongo_url, db_name, client):
    """An execution whose own JSON would not leave the store room for a full trace ring and
    dedupe window is refused before anything is sent, the message naming the context and by
    how much it is over; nothing is stored. One that fits is never wedged later."""
    store = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    budget = data_budget(200, DEFAULT_TRACE_STEP_BYTES, 1000)
    too_big = Execution(id="huge", definition_id="d", context={"blob": "z" * budget})
    with pytest.raises(ExecutionTooLarge) as err:
        store.commit(too_big, [])
    message = str(err.value)
    assert "of which its context" in message and "over by" in message and "trace ring" in message
    assert err.value.size > err.value.limit == budget
    assert client[db_name]["harel_executions"].find_one({"_id": "huge"}) is None
    fits = Execution(id="fits", definition_id="d", context={"blob": "z" * (budget - 4096)})
    store.commit(fits, [], processed_event_id="e0")
    for i in range(3):
        store.commit(fits, [], processed_event_id=f"e{i + 1}", trace={"context_out": fits.context, "i": i})
    assert len(store.read_trace("fits")) == 3
    store.close()


def test_a_commit_refused_for_pending_user_data_names_what_is_large(mongo_url, db_name, client):
    """The user's own events, emitted and not yet relayed, filling the document: the server
    refuses the commit that would pass the limit; the error names the pending outbox, its
    size and how far over the limit the document would be. The stored copy is unchanged."""
    store = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    exe = Execution(id="fill", definition_id="d")
    store.commit(exe, [])
    payload = {"blob": "p" * (3 * 1024 * 1024)}
    with pytest.raises(ExecutionTooLarge) as err:
        for i in range(8):
            store.commit(exe, [(None, Event(kind="Big", data=payload))])
    assert "pending outbox" in str(err.value) and "over by" in str(err.value)
    assert err.value.parts["pending outbox"] > 9 * 1024 * 1024 and err.value.size > MAX_DOCUMENT_BYTES
    stored = client[db_name]["harel_executions"].find_one({"_id": "fill"}, {"version": 1})
    assert stored["version"] == exe.version  # the refused commit wrote nothing
    store.close()
