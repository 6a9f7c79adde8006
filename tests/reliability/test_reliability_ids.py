"""Ids of every shape a user may choose, through every store operation and through the
worker's relay scoping.

A user names root executions; harel names every child `<parent id>:<path>:<n>`. So an id
may hold `:` (harel's own separator), `.`, `$`, the store's path escapes, any Unicode, be
empty, be long, or be a prefix of another. Two ids must never be confused: not by a read,
a write, an ack, a sweep, a prefix search, a purge, nor by the relay a worker runs after an
event, which must see only the handled execution's tree (its `parent_id` chain), never a
root that merely starts with the same characters.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, AsyncIterator, NamedTuple, Optional

import pymongo
import pytest
from harel import definition_from_dsl_file
from harel.engine.aio.distributed import AsyncDistributedRunner, AsyncWorker
from harel.engine.execution import Execution, Status
from harel.engine.schema import Names
from harel.engine.store.base import TimerOp
from harel.spec.states import Event
from pymongo import monitoring

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.deploy.relay import sweep
from harel_beanie.deploy.serving import sweep_forever
from harel_beanie.deploy.stack import CountingWorker
from harel_beanie.harness.drivers import ManualClock, open_mongo_transport
from tests.support.figures import Figures

LONG = "L" * 4000
#: Roots a user may name: harel's separator inside and at the ends, prefixes of one
#: another, MongoDB's and the path encoding's special characters, Unicode, empty, long.
IDS = [
    "a",
    "a:b",
    "a:b:c",
    "a:",
    ":a",
    ":",
    "::",
    "",
    " ",
    "ab",
    "a.b",
    "a$b",
    "$a",
    "$",
    "a\uff0eb",
    "\uff05",
    "%2E",
    "a:R:0",
    "日本:ü",
    "🙂:🙂",
    "tab\t:x",
    "nul\x00:x",
    LONG,
    LONG + ":x",
]


def _kind(exe_id: str) -> str:
    return "k:" + exe_id  # every entry names its holder, so a misfiled one shows


def _fill(store: Any, ids: list[str], now: float = 1000.0) -> None:
    """Each id a root with one of everything: emits to the next id and the one after, a
    spawn, a timer, a processed event id, a trace step."""
    for n, exe_id in enumerate(ids):
        near, far = ids[(n + 1) % len(ids)], ids[(n + 2) % len(ids)]
        store.commit(
            Execution(id=exe_id, definition_id="def:" + exe_id, context={"me": exe_id}),
            [
                (near, Event(id="ev1:" + exe_id, kind=_kind(exe_id))),
                (far, Event(id="ev2:" + exe_id, kind=_kind(exe_id))),
            ],
            processed_event_id="seen:" + exe_id,
            timers=(TimerOp("schedule", "T." + exe_id, now + n),),
            spawns=((exe_id + ":Kid:0", "Kid", {"of": exe_id}),),
            trace={"step": exe_id},
        )


def test_every_store_operation_keeps_ids_of_every_shape_apart(either: Any, figures: Figures) -> None:
    """Every operation on 24 roots whose ids are prefixes of one another, hold `:` `.` `$`,
    the path escapes, Unicode, NUL, are empty or 4,000 characters: each answers for its own
    id only. Scoped pending reads (`within=`) see the root alone, since none of them is
    another's child whatever its id starts with."""
    _fill(either, IDS)
    for n, exe_id in enumerate(IDS):
        exe = either.load(exe_id)
        assert exe is not None and exe.id == exe_id and exe.context == {"me": exe_id}
        loaded, seen = either.load_for_event(exe_id, "seen:" + exe_id)
        assert loaded is not None and loaded.id == exe_id and seen
        assert either.load_for_event(exe_id, "seen:" + IDS[n - 1]) == (loaded, False)
        assert either.is_processed(exe_id, "seen:" + exe_id)
        assert [s["step"] for s in either.read_trace(exe_id)] == [exe_id]
        assert sorted(either.ids_with_prefix(exe_id)) == sorted(i for i in IDS if i.startswith(exe_id))
        assert [e.event.kind for e in either.pending_outbox(within=exe_id)] == [_kind(exe_id)] * 2
        assert [s.parent_id for s in either.pending_spawns(within=exe_id)] == [exe_id]
        page = either.list_executions(definition_id="def:" + exe_id)
        assert [s.id for s in page.items] == [exe_id]
    listed, cursor = [], None
    while True:
        page = either.list_executions(limit=5, cursor=cursor, roots_only=True)
        listed += [s.id for s in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert listed == sorted(IDS)
    # every timer fires for its own execution, and its delete touches only that one
    due = either.due_timers(1000.0 + len(IDS))
    assert sorted((i, p) for i, p, _ in due) == sorted((i, "T." + i) for i in IDS)
    for exe_id, path, at in due:
        either.delete_timer(exe_id, path, at)
    assert either.due_timers(float("inf")) == []
    # acks: each entry found in its own holder, by the seq the scoped read returned
    for exe_id in IDS[::2]:
        for e in either.pending_outbox(within=exe_id):
            either.ack_outbox(e.seq)
        for s in either.pending_spawns(within=exe_id):
            either.ack_spawn(s.seq)
    left = {e.event.kind for e in either.pending_outbox()}
    assert left == {_kind(i) for i in IDS[1::2]}
    assert {s.parent_id for s in either.pending_spawns()} == set(IDS[1::2])
    # purge every other one: the rest, whatever their ids share, are untouched
    for exe_id in IDS[::2]:
        assert either.purge(exe_id, 1)
    for n, exe_id in enumerate(IDS):
        gone = n % 2 == 0
        assert (either.load(exe_id) is None) == gone
        assert sorted(either.ids_with_prefix(exe_id)) == sorted(i for i in IDS[1::2] if i.startswith(exe_id))
    # purge cleaned the entries addressed to a purged id, never one to a surviving id
    assert sorted(e.target_id for e in either.pending_outbox()) == sorted(IDS[1::2])
    figures.set(ids=len(IDS), longest=max(map(len, IDS)))


def _tree(store: Any, root: str, levels: int, pending: Optional[set[int]] = None) -> list[str]:
    """`root` and a chain of `levels` descendants named as harel names them, each with its
    real `parent_id`; the levels in `pending` (all by default) hold an outbox entry."""
    ids, parent = [root], None
    for level in range(levels + 1):
        exe_id = ids[-1]
        emits = [(None, Event(kind=_kind(exe_id)))] if pending is None or level in pending else []
        store.commit(Execution(id=exe_id, definition_id="d", parent_id=parent), emits)
        parent = exe_id
        ids.append(f"{exe_id}:Fork.R:{level}")
    return ids[:-1]


class Finds(monitoring.CommandListener):
    def __init__(self) -> None:
        self.filters: list[Any] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "find":
            self.filters.append(event.command.get("filter"))

    def succeeded(self, event: Any) -> None:
        pass

    def failed(self, event: Any) -> None:
        pass


@pytest.mark.parametrize("root", ["a", "a:b", "", ":", "日本", "a$.b", LONG])
def test_a_scoped_relay_sees_its_tree_by_parent_id_not_by_id_shape(
    mongo_url: str, db_name: str, root: str, figures: Figures
) -> None:
    """`pending_outbox(within=root)` and `pending_spawns(within=root)` return exactly the
    entries of `root` and its descendants by the `parent_id` chain. Beside the tree: roots
    whose ids extend `root` as a child's would (`root:Fork.R:0:x`, `root:`, `root::`), one
    of them holding a tree of its own. One find when every holder's parent is `root` or
    another holder; one more `_id` read per missing level when an ancestor holds nothing."""
    finds = Finds()
    store = MongoStore(pymongo.MongoClient(mongo_url, event_listeners=[finds]), db_name)
    try:
        tree = _tree(store, root, 3)
        impostors = [tree[1] + ":x", root + ":", root + "::", root + ":Fork.R:0:Fork.R:1x"]
        for exe_id in impostors:
            store.commit(Execution(id=exe_id, definition_id="d"), [(None, Event(kind=_kind(exe_id)))])
        other = _tree(store, root + ":Fork.R:0:Fork.R:9", 2)  # a root shaped like a grandchild
        store.init()
        finds.filters.clear()
        assert {e.event.kind for e in store.pending_outbox(within=root)} == {_kind(i) for i in tree}
        dense = len(finds.filters)
        assert dense == 1  # the common case: no read beyond the pending index
        assert {e.event.kind for e in store.pending_outbox(within=tree[1])} == {_kind(i) for i in tree[1:]}
        assert {e.event.kind for e in store.pending_outbox(within=other[0])} == {_kind(i) for i in other}
        for exe_id in impostors:
            assert [e.event.kind for e in store.pending_outbox(within=exe_id)] == [_kind(exe_id)]
        # a sparse tree: only the leaf holds work; its ancestors are read, one level a round
        sparse_root = root + "\uff0e"
        sparse = _tree(store, sparse_root, 3, pending={3})
        finds.filters.clear()
        assert [e.event.kind for e in store.pending_outbox(within=sparse_root)] == [_kind(sparse[-1])]
        assert len(finds.filters) == 1 + 2  # the pending index, then levels 2 and 1
        assert all(list(f["_id"]) == ["$in"] for f in finds.filters[1:])
        figures.set(
            finds_whole_tree_pending=dense, finds_only_leaf_pending=len(finds.filters), impostors=len(impostors) + 1
        )
    finally:
        store.close()


def test_a_scoped_read_of_a_tree_whose_middle_was_purged(either: Any) -> None:
    """A descendant whose ancestor between it and the root is gone is not the root's to
    relay (the sweep relays it with its own definition); its siblings still are."""
    tree = _tree(either, "p:q", 3, pending={0, 1, 3})
    either.purge(tree[2], 1)
    assert {e.event.kind for e in either.pending_outbox(within="p:q")} == {_kind(tree[0]), _kind(tree[1])}


# --- the worker's relay, with harel's own driver ------------------------------------------

FORK = (
    "machine Forker { initial Split\n"
    " orthogonal Split { state A { initial A1 final A1 success } state B { initial B1 final B1 success } }\n"
    " final End success\n from Split to End }\n"
)
#: another machine that forks at once, into regions of other names: its relay has work to do
SPLITTER = (
    "machine Splitter { initial Par\n"
    " orthogonal Par { state X { initial X1 final X1 success } state Y { initial Y1 final Y1 success } }\n"
    " final End success\n from Par to End }\n"
)


class Forks(NamedTuple):
    """The Forker and Splitter machines on the async store and harel's Mongo transport, on
    one `ManualClock` (the `forks` fixture)."""

    store: AsyncMongoStore
    transport: Any
    clock: ManualClock
    definitions: dict[str, Any]
    executions: Any  # the executions collection, as the worker and the sweep are given it
    runner: AsyncDistributedRunner


@pytest.fixture
async def forks(mongo_url: str, db_name: str, tmp_path: Path) -> AsyncIterator[Forks]:
    (tmp_path / "forker.stm").write_text(FORK)
    (tmp_path / "splitter.stm").write_text(SPLITTER)
    definitions = {
        "Forker": definition_from_dsl_file(tmp_path / "forker.stm", validate=True),
        "Splitter": definition_from_dsl_file(tmp_path / "splitter.stm", validate=True),
    }
    client: Any = pymongo.AsyncMongoClient(mongo_url)
    store = AsyncMongoStore(client, db_name)
    clock = ManualClock()
    transport = await open_mongo_transport(mongo_url, db_name, clock=clock)
    try:
        runner = AsyncDistributedRunner(store, transport, definitions, clock=clock)
        yield Forks(store, transport, clock, definitions, client[db_name][Names("harel").executions], runner)
    finally:
        await transport.close()
        await store.close()


async def test_the_periodic_sweep_starts_children_on_the_workers_clock(forks: Forks) -> None:
    """A worker's periodic relay sweep (`sweep_forever`) and its start-up one run the
    children they start on the worker's clock, as its handlers do: a child started on
    another clock arms its timers where the worker never looks (the crash test's payment
    child, started by the sweep on the wall clock while the worker ran on the test's clock,
    waited for a timer eleven months ahead of it)."""
    store, transport, clock, definitions, executions, runner = forks
    clock.advance(3600.0)
    worker = CountingWorker(store, transport, definitions, executions=executions, clock=clock)
    assert worker.clock is clock
    parent, child = "sw:q", "sw:q:Call:0"
    await runner.create("Splitter", {}, execution_id=parent)
    await store.commit(Execution(id=child, definition_id="Forker", parent_id=parent), [])
    exe = await store.load(child)
    await store.commit(exe, [], spawns=((child + ":Split.A:0", "Split.A", {}),))
    stop = asyncio.Event()
    sweeping = asyncio.create_task(sweep_forever(store, transport, executions, worker, 0.01, stop, False))
    for _ in range(500):
        if not await store.pending_spawns():
            break
        await asyncio.sleep(0.01)
    stop.set()
    await sweeping
    region = await store.load(child + ":Split.A:0")
    assert region is not None and region.updated_at == clock(), (region.updated_at if region else None, clock())


class Unrelayed:
    """The store as a process that dies between its commit and its relay sees it: the
    commit lands, the relay finds nothing, so the spawns stay pending."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def pending_outbox(self) -> list[Any]:
        return []

    async def pending_spawns(self) -> list[Any]:
        return []


@pytest.mark.parametrize("pair", [("a", "a:b"), ("o", "o:Split.A:0"), ("", ":"), ("x.y", "x.y:$z")])
async def test_a_workers_relay_never_takes_another_roots_spawns(
    forks: Forks, pair: tuple[str, str], figures: Figures
) -> None:
    """Two roots, the second named as if it were the first's child (`a` and `a:b`, or even
    exactly the id harel would give `o`'s region). `a:b` forked (a `Forker`) and its
    process died before relaying: its region spawns are pending. The relay the worker
    (`CountingWorker`, what `harel-beanie worker` runs) makes after `a`'s event, with `a`'s
    definition (a `Splitter`, which forks too), must relay `a`'s regions and leave `a:b`'s
    alone; relaying them there would create `a:b`'s regions as Splitters. The sweep then creates them with `a:b`'s own definition."""
    first, second = pair
    store, transport, clock, definitions, executions, runner = forks
    await runner.create("Forker", {}, execution_id=second)
    crashed = AsyncWorker(Unrelayed(store), transport, definitions, clock=clock)
    assert await crashed.step()  # the fork commits; the relay never happens
    pending = await store.pending_spawns()
    assert {s.parent_id for s in pending} == {second} and len(pending) == 2
    await runner.create("Splitter", {}, execution_id=first)
    worker = CountingWorker(store, transport, definitions, clock=clock, executions=executions)
    lease = await worker._claim()  # as its run loop does: claim, then handle
    assert lease is not None and lease.group_id == first
    assert await worker._handle(lease)
    assert await store.pending_spawns() == pending  # not the Splitter's to relay
    assert not [s for s in (await store.list_executions()).items if s.parent_id == second]
    mine = [s for s in (await store.list_executions(definition_id="Splitter")).items if s.parent_id == first]
    assert len(mine) == 2  # its own regions it did relay
    assert await sweep(store, transport, executions, definitions, clock) == 1
    assert await store.pending_spawns() == []
    kids = (await store.list_executions(definition_id="Forker")).items
    regions = [k for k in kids if k.parent_id == second]
    assert len(regions) == 2 and all(k.id.startswith(second + ":Split.") for k in regions)
    assert {k.parent_id for k in (await store.list_executions(definition_id="Splitter")).items} == {None, first}
    assert all(k.status != Status.FAILED for k in kids)
    figures.set(own_regions_relayed=len(mine), other_roots_spawns_left=len(pending), created_by_sweep=len(regions))


def test_a_scoped_read_over_documents_harel_wrote(mongo_url: str, db_name: str) -> None:
    """A database harel's own MongoStore wrote, not migrated: its documents carry no
    promoted `parent_id`, so the chain is read from their `data`. A root named like a child
    of another root is still told apart."""
    from harel.engine.store import MongoStore as HarelMongoStore

    theirs = HarelMongoStore(pymongo.MongoClient(mongo_url), db_name)
    for exe_id, parent in (("h", None), ("h:R:0", "h"), ("h:R:0:S:1", "h:R:0"), ("h:R:0:x", None)):
        theirs.commit(Execution(id=exe_id, definition_id="d", parent_id=parent), [(None, Event(kind=_kind(exe_id)))])
    ours = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    try:
        assert {e.event.kind for e in ours.pending_outbox(within="h")} == {
            _kind("h"),
            _kind("h:R:0"),
            _kind("h:R:0:S:1"),
        }
        assert [e.event.kind for e in ours.pending_outbox(within="h:R:0:x")] == [_kind("h:R:0:x")]
    finally:
        ours.close()


async def test_the_sweep_relays_each_owners_spawns_with_its_own_definition(forks: Forks, figures: Figures) -> None:
    """The sweep relays every owner of pending work with that owner's definition. An owner's
    descendant may run another machine (an invoked submachine, here a `Forker` under a
    `Splitter`) and hold region spawns of its own, left by a worker that died before its
    relay. The ancestor's pass must not create them (with the ancestor's definition they
    would be `Splitter` regions at a `Forker` path); the descendant's own pass does."""
    store, transport, clock, definitions, executions, runner = forks
    parent, child = "p:q", "p:q:Call:0"
    await runner.create("Splitter", {}, execution_id=parent)
    # the parent holds work of its own (an event for itself), the child its regions
    await store.commit(await store.load(parent), [(parent, Event(id="poke", kind="Poke"))])
    await store.commit(Execution(id=child, definition_id="Forker", parent_id=parent), [])
    exe = await store.load(child)
    await store.commit(exe, [], spawns=((child + ":Split.A:0", "Split.A", {}), (child + ":Split.B:0", "Split.B", {})))
    assert await sweep(store, transport, executions, definitions, clock) == 2
    assert await store.pending_spawns() == []
    regions = [k for k in (await store.list_executions()).items if k.parent_id == child]
    assert sorted(k.id for k in regions) == [child + ":Split.A:0", child + ":Split.B:0"]
    assert {k.definition_id for k in regions} == {"Forker"}
    figures.set(owners_swept=2, regions_created=len(regions))
