"""The write oracle of the store: for every accepted write, the whole database after it is
what the reference model (tests/support/write_model.py) makes of the whole database before
it, document by document and field by field; nothing else changes.

Each example seeds a small database through the store itself (executions with outbox
entries, spawns, timers, traces, second commits, purges and folds, all drawn), takes a
snapshot of every collection, makes one write with drawn arguments (ids of what is stored
and of what is not, versions right and stale, seqs held and not, timers armed and not) and
compares. The store's clock is pinned (the tombstone's time comes from it); the seqs the
mint hands out are recorded on the way (the model places them); the seq mint's own lease
documents are the one part of the database a write with entries may change beyond its model
(they are the store instance's bookkeeping, their times from the mint's clock).

The default budget keeps this file to about half a minute; `make soak` runs the same
properties with many more examples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import pytest
from harel.engine.execution import Execution, Status
from harel.engine.store import base as harel_base
from harel.engine.store.base import StoreConflict, TimerOp
from harel.spec.states import Event
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from harel_beanie.core.keys import encode_path
from tests.support import write_model as model
from tests.support.both import BlockingAsyncStore, close_store, make_store
from tests.support.fuzz_strategies import close_ids, fire_time, json_object
from tests.support.fuzz_strategies import oracle_budget as budget
from tests.support.mutation import mutated
from tests.support.write_model import Snapshot, expect_equal, snapshot

CLOCK = 1_800_000_000.25  # the store's pinned wall clock
RING, WINDOW = 3, 2  # a short trace ring and dedupe window, so that both slide
MINT_DOCS = ("harel_beanie:node",)  # the seq mint's node counter and node leases (prefix)

ids = st.one_of(st.sampled_from(["a", "a:Pay:0", "b", "$x", "d.e", "日本"]), close_ids)
definitions = st.sampled_from(["Order", "Ship", "$d.x%"])
statuses = st.sampled_from(list(Status))
paths = st.sampled_from(["T", "a.b", "$t", "", "x/y"])
events = st.builds(
    Event, kind=st.sampled_from(["A", "B.c"]), data=st.dictionaries(st.sampled_from(["k", "$k"]), st.integers())
)
emits = st.lists(st.tuples(st.one_of(st.none(), ids), events), max_size=2)
timer_ops = st.lists(
    st.one_of(
        st.builds(lambda p, at: TimerOp("schedule", p, at), paths, fire_time),
        st.builds(lambda p: TimerOp("cancel", p), paths),
    ),
    max_size=3,
).map(tuple)
spawns = st.lists(st.tuples(ids, st.sampled_from(["R", "S.t"]), json_object), max_size=1).map(tuple)
traces = st.one_of(st.none(), json_object)
processed = st.one_of(st.none(), st.sampled_from(["ev1", "ev2", "x" * 200]))


@dataclass
class Step:
    """One commit of the seeded history."""

    exe_id: str
    definition: str
    status: Status
    emits: list[Any]
    timers: tuple[Any, ...]
    spawns: tuple[Any, ...]
    trace: Optional[dict[str, Any]]
    processed: Optional[str]


steps = st.builds(Step, ids, definitions, statuses, emits, timer_ops, spawns, traces, processed)


@dataclass
class World:
    """What a seeded history did: commits (an id committed twice is moved on), purges of
    some ids, and folds of some partitions."""

    steps: list[Step]
    purges: list[int] = field(default_factory=list)
    fold_after: Optional[int] = None  # a fold of every partition after this many commits


worlds = st.builds(
    World,
    st.lists(steps, min_size=1, max_size=5),
    st.lists(st.integers(0, 4), max_size=2),
    st.one_of(st.none(), st.integers(0, 3)),
)


class Harness:
    """A store (the sync one, or the async one behind a blocking facade) on a database of
    its own, with its clock pinned and its mint recorded."""

    def __init__(self, kind: str, url: str, client: Any, db_name: str) -> None:
        self.kind, self.db = kind, client[db_name]
        self.store = make_store(kind, url, db_name, trace_max=RING, dedupe_window=WINDOW)
        self.store.init()
        state = (self.store.inner if isinstance(self.store, BlockingAsyncStore) else self.store)._state
        state.clock = lambda: CLOCK
        self.minted: list[list[int]] = []
        take = state.mint.take

        def recorded(count: int, above: int = 0) -> Any:
            seqs = take(count, above)
            if seqs is not None:
                self.minted.append(list(seqs))
            return seqs

        state.mint.take = recorded  # type: ignore[method-assign]

    def reset(self) -> None:
        for name in (model.EXES, model.COUNTS, model.QUEUES, model.OVERFLOW):
            self.db[name].delete_many({})

    def seed(self, world: World) -> None:
        """Build the world through the store (what it writes here is not under test)."""
        self.reset()
        for n, s in enumerate(world.steps):
            if n == world.fold_after:
                self.store.fold_counts()
            stored = self.store.load(s.exe_id)
            exe = stored or Execution(id=s.exe_id, definition_id=s.definition)
            exe.status = s.status
            try:
                self.store.commit(exe, s.emits, s.processed, s.timers, s.spawns, s.trace)
            except StoreConflict:  # a tombstone met by a fresh id: harel's own answer
                pass
        live = sorted(d["_id"] for d in self.db[model.EXES].find({"tomb": {"$exists": False}}))
        for n in world.purges:
            if live:
                gone = live.pop(n % len(live))
                doc = self.db[model.EXES].find_one({"_id": gone})
                self.store.purge(gone, doc["version"])

    def before(self) -> Snapshot:
        self.minted.clear()
        return snapshot(self.db)

    def after(self, before: Snapshot, *, minting: bool) -> Snapshot:
        """The database after the write; with `minting`, the mint's lease documents as they
        were before (a write with entries may take or extend a lease: its own bookkeeping,
        their `expires` from the clock and `hi` from the mint's millisecond clock)."""
        now = snapshot(self.db)
        if minting:
            counters = now.setdefault(model.COUNTERS, {})
            for i in list(counters) + list(before.get(model.COUNTERS, {})):
                if isinstance(i, str) and i.startswith(MINT_DOCS):
                    if i in before.get(model.COUNTERS, {}):
                        counters[i] = before[model.COUNTERS][i]
                    else:
                        counters.pop(i, None)
        return now

    def stored(self) -> list[dict[str, Any]]:
        return list(self.db[model.EXES].find({}))


@pytest.fixture(params=["sync", "async"])
def harness(request: pytest.FixtureRequest, mongo_url: str, client: Any, db_name: str) -> Iterator[Harness]:
    h = Harness(request.param, mongo_url, client, db_name)
    yield h
    close_store(h.store)


DEFAULT, SOAK = budget(10), settings(budget(200), derandomize=False)
#: a planted fault is found, not shrunk: the failure is the point, its smallest form is not
FAULTS = settings(DEFAULT, phases=[Phase.explicit, Phase.generate])


# --- the properties, one per door --------------------------------------------------------------


def one_of_stored(docs: list[dict[str, Any]]) -> st.SearchStrategy[str]:
    """Mostly the id of a stored document (an execution or a tombstone), sometimes any."""
    if not docs:
        return ids
    stored = st.sampled_from([d["_id"] for d in docs])
    return st.one_of(stored, stored, stored, ids)


def live_ones(h: Harness) -> list[dict[str, Any]]:
    """The live executions, one committed (with an entry of each kind and a timer) if the
    world left none: a case that needs one always has one."""
    live = [d for d in h.stored() if "tomb" not in d]
    if not live:
        exe = Execution(id="seeded-live", definition_id="Order")
        h.store.commit(exe, [("a", Event(kind="A"))], None, (TimerOp("schedule", "T", 5.0),), (("c", "R", {}),))
        live = [d for d in h.stored() if "tomb" not in d]
    return live


def commit_property(h: Harness, world: World, data: st.DataObject, case: str) -> None:
    h.seed(world)
    live = live_ones(h)
    if case == "over a tombstone" and not any("tomb" in d for d in h.stored()):
        h.store.purge(live[0]["_id"], live[0]["version"])  # the world had none: make one
        live = live_ones(h)
    tombs = [d["_id"] for d in h.stored() if "tomb" in d]
    taken = {d["_id"] for d in h.stored()}
    if case in ("loaded", "stale version", "save"):
        loaded = h.store.load(data.draw(st.sampled_from([d["_id"] for d in live])))
        assert loaded is not None
        exe = loaded
        if case == "stale version":
            exe.version = data.draw(st.integers(1, 5).filter(lambda v: v != loaded.version))
    elif case == "over a tombstone":
        exe = Execution(id=data.draw(st.sampled_from(tombs)), definition_id=data.draw(definitions))
    elif case == "over a live one":
        exe = Execution(id=data.draw(st.sampled_from([d["_id"] for d in live])), definition_id=data.draw(definitions))
    else:
        exe = Execution(id=data.draw(ids.filter(lambda i: i not in taken)), definition_id=data.draw(definitions))
    target = exe.id
    exe.status = data.draw(statuses)
    exe.context = data.draw(json_object)
    saving = case == "save"  # `save`: a commit with nothing but the execution
    # harel's description: none, or a step from the status it was loaded with or any other
    # (a wrong one: the store's pins must catch it, core/commit.py)
    stored_status = next((d.get("status") for d in h.stored() if d["_id"] == target), None)
    said = data.draw(st.one_of(st.just(stored_status), statuses.map(lambda s: s.value)))
    step = (
        None if saving or data.draw(st.booleans()) else harel_base.Step("event", Status(said or exe.status), exe.status)
    )
    call = model.Commit(
        exe=exe.model_copy(deep=True),
        version=exe.version,
        emits=[] if saving else data.draw(emits),
        processed=None if saving else data.draw(processed),
        timers=() if saving else data.draw(timer_ops),
        spawns=() if saving else data.draw(spawns),
        trace=None if saving else data.draw(traces),
        ring=RING,
        window=WINDOW,
        encode=encode_path,
        step=step,
    )
    before = h.before()
    try:
        if saving:
            h.store.save(exe)
        else:
            h.store.commit(
                exe, list(call.emits), call.processed, tuple(call.timers), tuple(call.spawns), call.trace, step
            )
        outcome = "landed"
    except StoreConflict:
        outcome = "conflict"
    call.seqs = h.minted[-1] if h.minted else []
    expected, says = model.commit(before, call)
    assert outcome == says, f"commit of {target!r} at version {call.version}: {outcome}, the model says {says}"
    assert says == ("conflict" if case in ("stale version", "over a live one") else "landed"), (case, says)
    expect_equal(f"commit({target!r}, v{call.version})", expected, h.after(before, minting=bool(h.minted)))


def purge_property(h: Harness, world: World, data: st.DataObject, case: str) -> None:
    h.seed(world)
    live = live_ones(h)
    if case == "at its version":
        target = data.draw(st.sampled_from([d["_id"] for d in live]))
        version = next(d["version"] for d in live if d["_id"] == target)
    else:  # any id, stored or not, at any version
        target, version = data.draw(one_of_stored(h.stored())), data.draw(st.integers(0, 4))
    before = h.before()
    purged = h.store.purge(target, version)
    expected, says = model.purge(before, target, version, CLOCK)
    assert purged == says, f"purge({target!r}, {version}) returned {purged}, the model says {says}"
    assert says or case != "at its version"
    expect_equal(f"purge({target!r}, {version})", expected, h.after(before, minting=False))


def ack_property(h: Harness, world: World, data: st.DataObject, case: str, array: str) -> None:
    h.seed(world)
    live_ones(h)
    held = [e["seq"] for d in h.stored() for e in d.get(array) or []]
    if case == "held" and held:
        seq = data.draw(st.sampled_from(held))
    else:
        seq = data.draw(st.integers(1, 2**62).filter(lambda s: s not in held))
    before = h.before()
    getattr(h.store, "ack_outbox" if array == "outbox" else "ack_spawn")(seq)
    expected = model.ack(before, array, seq)
    assert (expected != before) == (seq in held), (case, seq, held)
    expect_equal(f"ack of {array} seq {seq}", expected, h.after(before, minting=False))


def delete_timer_property(h: Harness, world: World, data: st.DataObject, case: str) -> None:
    h.seed(world)
    live = live_ones(h)
    armed = [(d["_id"], key, at) for d in h.stored() for key, at in (d.get("timers") or {}).items()]
    if case == "armed" and not armed:  # the world armed none: arm one
        exe = h.store.load(live[0]["_id"])
        assert exe is not None
        h.store.commit(exe, [], None, (TimerOp("schedule", "a.b", 7.5),))
        armed = [(d["_id"], key, at) for d in h.stored() for key, at in (d.get("timers") or {}).items()]
    paths_by_key = {encode_path(p): p for p in ["T", "a.b", "$t", "", "x/y"]}
    if case == "armed":
        target, key, at = data.draw(st.sampled_from(armed))
        path = paths_by_key[key]
    else:  # any id and path, at any time (a timer fired at another time, or never armed)
        target, path, at = data.draw(one_of_stored(h.stored())), data.draw(paths), data.draw(fire_time)
    before = h.before()
    h.store.delete_timer(target, path, at)
    expected = model.delete_timer(before, target, encode_path(path), at)
    assert expected is not before or case != "armed"
    expect_equal(f"delete_timer({target!r}, {path!r}, {at!r})", expected, h.after(before, minting=False))


def due_timers_property(h: Harness, world: World, data: st.DataObject, case: str) -> None:
    h.seed(world)
    live = live_ones(h)
    now = data.draw(fire_time)
    if case == "a stale bound":  # armed, then removed leaving the bound where it was
        exe = h.store.load(live[0]["_id"])
        assert exe is not None
        armed = list((live[0].get("timers") or {}).values())
        now = min([now, *armed]) - 10.0  # none of its other timers due: the bound is stale
        h.store.commit(exe, [], None, (TimerOp("schedule", "stale", now - 1.0),))
        # removed as a cancel by an older version of the store removed it, or the in-memory
        # sweep (a commit's cancel leaves no stale bound: core.stuck, Rule T1)
        h.db[model.EXES].update_one({"_id": exe.id}, {"$unset": {"timers.stale": ""}, "$set": {"cdirty": True}})
    before = h.before()
    h.store.due_timers(now)
    expected = model.due_timers(before, now)
    assert expected != before or case != "a stale bound"
    expect_equal(f"due_timers({now!r})", expected, h.after(before, minting=False))


def append_trace_property(h: Harness, world: World, data: st.DataObject, case: str) -> None:
    h.seed(world)
    live = live_ones(h)
    if case == "live":
        target = data.draw(st.sampled_from([d["_id"] for d in live]))
    else:  # a tombstone, or an id never stored
        tombs = [d["_id"] for d in h.stored() if "tomb" in d]
        taken = {d["_id"] for d in h.stored()}
        target = data.draw(
            st.one_of(ids.filter(lambda i: i not in taken), *([st.sampled_from(tombs)] if tombs else []))
        )
    entry = data.draw(json_object)
    before = h.before()
    h.store.append_trace(target, entry)
    expected = model.append_trace(before, target, entry, RING)
    assert (expected is before) == (case != "live")
    expect_equal(f"append_trace({target!r})", expected, h.after(before, minting=False))


def fold_property(h: Harness, world: World, data: st.DataObject, case: str) -> None:
    h.seed(world)
    live = live_ones(h)
    if case == "dirty over built counters":
        h.store.fold_counts()  # every counter built, then one execution changed
        exe = h.store.load(live[0]["_id"])
        assert exe is not None
        exe.status = data.draw(statuses)
        h.store.commit(exe, [])
        parts, only = None, None
    else:
        parts = data.draw(st.one_of(st.none(), st.lists(st.integers(0, model.PARTS - 1), max_size=4)))
        known = [d["_id"] for d in h.stored()]
        only = data.draw(st.one_of(st.none(), st.lists(st.one_of(ids, st.sampled_from(known)), max_size=3)))
    before = h.before()
    folded = h.store.fold_counts(parts, ids=only)
    expected, says = model.fold(before, parts, only)
    assert folded == says, f"fold_counts({parts}, ids={only}) folded {folded}, the model says {says}"
    assert says or case != "dirty over built counters"
    expect_equal(f"fold_counts({parts}, ids={only})", expected, h.after(before, minting=False))


PROPERTIES: dict[str, Callable[[Harness, World, st.DataObject, str], None]] = {
    "commit": commit_property,
    "purge": purge_property,
    "ack_outbox": lambda h, w, d, c: ack_property(h, w, d, c, "outbox"),
    "ack_spawn": lambda h, w, d, c: ack_property(h, w, d, c, "spawns"),
    "delete_timer": delete_timer_property,
    "due_timers": due_timers_property,
    "append_trace": append_trace_property,
    "fold_counts": fold_property,
}
#: the cases each door is run in, each with its own examples (each property asserts its
#: case's outcome, so a narrowed strategy cannot quietly skip one)
CASES = {
    "commit": ["new id", "loaded", "save", "stale version", "over a tombstone", "over a live one"],
    "purge": ["at its version", "any"],
    "ack_outbox": ["held", "not held"],
    "ack_spawn": ["held", "not held"],
    "delete_timer": ["armed", "any"],
    "due_timers": ["a stale bound", "any"],
    "append_trace": ["live", "not live"],
    "fold_counts": ["dirty over built counters", "any"],
}


def run(h: Harness, door: str, examples: settings, cases: Optional[list[str]] = None) -> None:
    for case in cases or CASES[door]:

        @examples
        @given(world=worlds, data=st.data())
        def prop(world: World, data: st.DataObject) -> None:
            PROPERTIES[door](h, world, data, case)

        prop()


@pytest.mark.parametrize("door", sorted(PROPERTIES))
def test_store_write_is_exactly_its_model(harness: Harness, door: str) -> None:
    """Each writing method of the store (`save` among `commit`'s cases), in each of its cases: the whole database after a drawn call is the model's. The async store's shell
    is run with fewer examples (the flows are the same; its own I/O is what it adds)."""
    run(harness, door, DEFAULT if harness.kind == "sync" else budget(3))


@pytest.mark.soak
@pytest.mark.parametrize("door", sorted(PROPERTIES))
def test_store_write_is_exactly_its_model_at_length(harness: Harness, door: str) -> None:
    run(harness, door, SOAK)


# --- the oracle can fail ----------------------------------------------------------------------


def test_the_oracle_catches_a_purge_that_corrupts_its_own_tombstone(harness: Harness) -> None:
    """A purge writing its tombstone's time wrong, or dropping the creations it buries, is
    caught (the old oracle let the purge change its own document in any way)."""
    from harel_beanie.core.flows import purging

    faults = [
        ('"at": st.clock()', '"at": st.clock() + 1'),
        ('"buried": buried, "by"', '"buried": [], "by"'),
    ]
    for old, new in faults:
        with mutated(purging, "purge", old, new):
            with pytest.raises(AssertionError, match="not what its model says"):
                run(harness, "purge", FAULTS, ["at its version"])


def test_the_oracle_catches_a_fold_that_zeroes_the_counters(harness: Harness) -> None:
    """A fold that sets every counter's counts to zero as it applies a batch is caught."""
    from harel_beanie.core.flows import counting

    old = "yield from _mark(part, seq + 1, entries)"
    new = 'yield UpdateOne("counts", {"_id": part}, {"$set": {"n": {}, "t": 0, "v": 0}}); ' + old
    with mutated(counting, "_fold_batch", old, new):
        with pytest.raises(AssertionError, match="not what its model says"):
            run(harness, "fold_counts", FAULTS, ["dirty over built counters"])
