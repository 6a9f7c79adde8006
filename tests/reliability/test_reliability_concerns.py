"""Write and read concerns: the stores take them as settings and every command carries them.

What each setting gives is in docs/design.md, "Durability"; these tests prove the
setting reaches the wire (a CommandListener on the store's own client sees every command),
for every write the store makes and for both stores.
"""

from __future__ import annotations

from typing import Any, Iterator

import pymongo
import pytest
from harel.engine.execution import Execution
from harel.engine.store.base import TimerOp
from harel.spec.states import Event
from pymongo.errors import PyMongoError, WriteConcernError
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from harel_beanie import DEFAULT_WRITE_CONCERN, AsyncMongoStore, MongoStore
from tests.support.both import BlockingAsyncStore, settle
from tests.support.wire import Recorder

WRITES = {"insert", "update", "findAndModify"}
MAJORITY_WRITE = {"w": "majority", "j": True}
MAJORITY_READ = {"level": "majority"}


def is_lease(cmd: dict[str, Any]) -> bool:
    """A command on the seq leases (the counters collection, past set-up's layout marker):
    always at majority, whatever the store's concerns (harel_beanie.core.seqs, Rule 7)."""
    name = next(iter(cmd))
    return cmd[name] == "harel_counters" and "harel_beanie:schema" not in str(cmd)


def is_confirm(cmd: dict[str, Any]) -> bool:
    """A read whose answer the store reports as a fact: an event already processed, or a
    commit whose reply was lost found landed. Read at majority when writes are."""
    projection = cmd.get("projection") or {}
    return "processed" in projection and "data" not in projection or "commit_tokens" in projection


def make(kind: str, url: str, db: str, log: Recorder, **options: Any) -> Any:
    if kind == "sync":
        return MongoStore(pymongo.MongoClient(url, event_listeners=[log]), db, **options)
    return BlockingAsyncStore(
        lambda: AsyncMongoStore(pymongo.AsyncMongoClient(url, event_listeners=[log]), db, **options)
    )


def close(store: Any) -> None:
    store.shutdown() if isinstance(store, BlockingAsyncStore) else store.close()


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param


def every_operation(store: Any) -> None:
    """One of each thing the store does: set-up, create, commit, relays, timers, trace, purge."""
    exe = Execution(id="c", definition_id="d")
    store.commit(exe, [("peer", Event(kind="A"))], timers=(TimerOp("schedule", "T", 1.0),), spawns=(("k", "R", {}),))
    store.commit(exe, [("c", Event(kind="B"))], processed_event_id="ev", trace={"s": 1})
    store.load("c")
    store.load_for_event("c", "ev")
    store.is_processed("c", "ev")
    store.list_executions()
    store.ids_with_prefix("c")
    store.read_trace("c")
    store.append_trace("c", {"s": 2})
    settle(store, 10.0)
    peer = Execution(id="peer", definition_id="d")
    store.commit(peer, [("c", Event(kind="ToC"))])
    assert store.purge("c", exe.version) is True  # its tombstone, and the update of the peer's outbox


def writes_and_reads(log: Recorder) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, dict[str, Any]]]]:
    writes = [(n, c) for n, c in log.commands if n in WRITES]
    reads = [(n, c) for n, c in log.commands if n == "find"]
    return writes, reads


def test_the_default_write_concern_is_on_every_write(kind, mongo_url, db_name, figures):
    """The default `w="majority", j=True` is on every `insert`, `update`, `delete` and
    `findAndModify` a run touching every operation sends, and no read concern is sent unless
    one is set."""
    log = Recorder()
    store = make(kind, mongo_url, db_name, log)
    every_operation(store)
    close(store)
    writes, reads = writes_and_reads(log)
    assert {n for n, _ in writes} == WRITES  # every kind of write the store makes was seen
    assert DEFAULT_WRITE_CONCERN.document == MAJORITY_WRITE
    for name, cmd in writes:
        assert cmd.get("writeConcern") == MAJORITY_WRITE, (name, cmd)
    assert any(is_confirm(c) for _, c in reads) and any(is_lease(c) for _, c in reads)
    for _, cmd in reads:
        if is_confirm(cmd) or is_lease(cmd):
            assert cmd.get("readConcern") == MAJORITY_READ, cmd  # what it reports can't roll back
        else:
            assert "readConcern" not in cmd, cmd  # the server's default unless one is set
    figures.set(writes_checked=len(writes), reads_checked=len(reads))


@pytest.mark.parametrize(
    "concern",
    [WriteConcern(w=1, j=False), WriteConcern(w=1, j=True, wtimeout=2500), WriteConcern(w="majority", wtimeout=1000)],
    ids=["w1", "w1-journal-wtimeout", "majority-wtimeout"],
)
def test_a_custom_write_concern_is_on_every_write(kind, mongo_url, db_name, concern):
    """A custom write concern (`w=1, j=False`, a `wtimeout`) replaces the default on every
    write of the run."""
    log = Recorder()
    store = make(kind, mongo_url, db_name, log, write_concern=concern)
    every_operation(store)
    close(store)
    writes, reads = writes_and_reads(log)
    assert {n for n, _ in writes} == WRITES
    for name, cmd in writes:
        assert cmd.get("writeConcern") == (MAJORITY_WRITE if is_lease(cmd) else concern.document), (name, cmd)
    for _, cmd in reads:
        # confirming at majority is only meaningful when the writes wait for a majority
        majority = is_lease(cmd) or (is_confirm(cmd) and concern.document.get("w") == "majority")
        assert cmd.get("readConcern") == (MAJORITY_READ if majority else None), cmd


def test_an_unsatisfiable_write_concern_is_reported_not_ignored(kind, mongo_url, db_name):
    """w=5 cannot be met by one server: the store surfaces the server's refusal as a
    PyMongo error instead of carrying on as if the write were durable."""
    log = Recorder()
    store = make(kind, mongo_url, db_name, log, write_concern=WriteConcern(w=5, wtimeout=200))
    try:
        with pytest.raises(PyMongoError) as err:
            store.commit(Execution(id="w5", definition_id="d"), [])
    finally:
        close(store)
    assert isinstance(err.value, (WriteConcernError, pymongo.errors.OperationFailure))
    assert any(c.get("writeConcern", {}).get("w") == 5 for _, c in log.commands)


def test_an_unacknowledged_write_concern_is_refused_up_front(kind, mongo_url, db_name):
    """`w=0` is refused when the store is made: a CAS whose outcome is never acknowledged
    cannot work."""
    with pytest.raises(ValueError, match="acknowledged|w=0"):
        store = make(kind, mongo_url, db_name, Recorder(), write_concern=WriteConcern(w=0))
        close(store)


@pytest.mark.parametrize("level", ["local", "majority"])
def test_the_read_concern_is_on_every_read(kind, mongo_url, db_name, level):
    """A read concern (`local`, `majority`) is on every `find` of the run, and the writes keep
    the default write concern."""
    log = Recorder()
    store = make(kind, mongo_url, db_name, log, read_concern=ReadConcern(level))
    every_operation(store)
    close(store)
    writes, reads = writes_and_reads(log)
    assert len(reads) >= 8
    for _, cmd in reads:
        expected = MAJORITY_READ if is_confirm(cmd) or is_lease(cmd) else {"level": level}
        assert cmd.get("readConcern") == expected, cmd
    for name, cmd in writes:
        assert cmd.get("writeConcern") == MAJORITY_WRITE, (name, cmd)  # still the default
