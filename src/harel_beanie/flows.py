"""Every store operation, written once as a flow of database calls.

A flow is a generator: it yields a call from `harel_beanie.calls`, the store makes it and
sends the result back in (or throws the driver's error in), and the flow's return value is
the operation's result. The logic of an operation (what it asks, in what order, what the
answers mean, what is retried) lives only here; `MongoStore` and `AsyncMongoStore` only make
the calls, one with PyMongo's sync client and one awaiting the async client. harel's engine
drives its own steps the same way (`yield from store(...)`).

`StoreState` is what a store instance knows between operations: its settings, its seq mint
and lease (taken on first mint), whether the database is a not-yet-migrated harel layout,
and which document holds each outbox/spawn seq it has seen, so an ack is addressed by `_id`.

Two rules the flows keep beyond a single write:

- Purge is final. A purged execution leaves a tombstone (`{_id, tomb: {at, buried}}`) that
  holds its id, so a creation insert that lands late, or is re-sent, fails on the id
  instead of bringing the execution and its pending work back. `buried` lists the creation
  tokens (`born`) of every incarnation purged under that id: a writer whose creation reply
  was lost finds its token there and knows it landed; any other creation of the id (harel's
  normal create of a reused id) replaces the tombstone. Every read treats a tombstone as
  no execution.
- What the store reports as landed or as already seen is read back at the level writes are
  acknowledged at (`confirm` reads: majority when the write concern is majority), so on a
  replica set it can't be rolled back after the store said so.

One relay read, not two. harel's relay asks `pending_spawns` and then, at once,
`pending_outbox`, on every pass. Both kinds of entry live in the documents flagged `pending`
(one partial index), so `pending_spawns` reads them together and keeps the outbox entries it
read; `pending_outbox` returns those instead of reading again only when it is the very next
operation on this store instance: no other operation of this instance (from any thread or
task) started or finished in between, it asks for the same `within`, and the entries are
used once (`StoreState.prefetched`). Why that answer is one a read would be allowed to give:
- It is exactly what a `pending_outbox` read would have returned at the moment the
  `pending_spawns` read ran (same filter, same documents, the outbox part of each).
- Anything this instance writes (a commit adding entries, an ack removing one, a purge)
  is an operation, so it voids the kept entries: the store never answers from before its
  own writes, nor from before anything its caller could have learnt through it.
- A write by another instance or process between the two calls is concurrent with the
  call: a read is allowed to miss it, exactly as a read made a moment earlier would. harel
  does not rely on one relay seeing another's fresh entries: the writer's own relay runs
  after its commit, and the next pass of any relay reads afresh (the cache never lasts
  past one call). An entry another relay acked meanwhile comes back once more, as it could
  from a read that raced that ack: harel's delivery is at-least-once and deduplicated by
  event id, and an ack of an entry already gone changes nothing.
tests/test_structure.py (`test_relay_pass_*`) checks the round trip saved and that a
commit, an ack or another `within` in between is seen.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Optional

import bson
from harel.engine.execution import Execution, ExecutionPage, Status
from harel.engine.store.base import OutboxEntry, SpawnEntry, Step, StoreConflict, TimerOp
from harel.spec.states import Event
from pymongo.errors import (
    ConnectionFailure,
    DocumentTooLarge,
    DuplicateKeyError,
    ExecutionTimeout,
    PyMongoError,
    WriteError,
)

from harel_beanie import records
from harel_beanie.calls import (
    CreateIndexes,
    DeleteOne,
    Find,
    FindOne,
    Flow,
    Increment,
    InsertOne,
    ReplaceOne,
    UpdateMany,
    UpdateOne,
)
from harel_beanie.commit import (
    DEFAULT_TRACE_STEP_BYTES,
    MAX_DOCUMENT_BYTES,
    CommitPlan,
    append_trace_update,
    data_budget,
    dedupe_keys,
    plan_commit,
    point,
    reserved_bytes,
)
from harel_beanie.documents import (
    NODE_COUNTER_ID,
    PENDING,
    SCHEMA_MARKER_ID,
    SCHEMA_VERSION,
    LoadView,
    OutboxView,
    PendingView,
    SpawnView,
    TimerView,
    TraceView,
    VersionView,
    projection,
)
from harel_beanie.errors import ExecutionTooLarge, SchemaMismatch
from harel_beanie.keys import ANY_SEQ, ANY_TIME, prefix_range, require_int, require_str, require_time, timer_field
from harel_beanie.listing import listing_page, listing_query
from harel_beanie.seqs import (
    HAREL_SEQ_COUNTERS,
    LEASE_TTL_S,
    NODES,
    Lease,
    SeqMint,
    extended_hi,
    lease_id,
    ms_floor_above,
    new_range,
)

log = logging.getLogger("harel_beanie")

# the server's codes for a document or update over the size limit
_TOO_LARGE_CODES = {10334, 17419, 17420, 13134}
_OWNERS_MAX = 100_000  # seq -> owner hints kept for addressing acks by _id
UNKNOWN_OUTCOME_RETRIES = 3  # re-sends of a commit whose reply was lost and that did not land
_LEASE_ROUNDS = 4  # lease extensions/takes one mint may need (a lost lease, then a new one)
_LEASE_PROBE = 64  # node lease documents read per round trip while looking for a free node
_TOMB_TRIES = 3  # replacements of a tombstone that keeps changing (purges racing) before a conflict
_BURIED_MAX = 64  # creation tokens a tombstone keeps (incarnations of one reused id)
NOT_A_TOMBSTONE = {"tomb": {"$exists": False}}


@dataclass
class StoreState:
    trace_max: int
    dedupe_window: int
    create_schema: bool
    where: str  # "db <name>, prefix <p>" for messages
    indexes: list[Any]
    trace_step_bytes: int = DEFAULT_TRACE_STEP_BYTES
    clock: Callable[[], float] = time.time  # wall seconds: lease expiry, tombstone time
    ready: bool = False
    compat: bool = False  # the database is harel's MongoStore layout, not migrated
    in_memory: bool = False  # the client is mongomock's: reads and writes it lacks take another form
    mint: SeqMint = field(default_factory=SeqMint)
    owners: dict[int, str] = field(default_factory=dict)
    # operations started or finished on this instance, and the outbox entries the last
    # `pending_spawns` read with the count they are valid at (see the module docstring)
    ops: int = 0
    prefetched: Optional[tuple[Optional[str], list[OutboxEntry], int]] = None
    _ops_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def op_started(self) -> None:
        """Called by the store before each operation (the shells' `_run`)."""
        with self._ops_lock:
            self.ops += 1

    def op_finished(self) -> None:
        """Called by the store after each operation, however it ended."""
        with self._ops_lock:
            self.ops += 1
            kept = self.prefetched
            if kept is not None and kept[2] < 0:
                # kept by the operation that just finished: valid until anything else happens
                self.prefetched = (kept[0], kept[1], self.ops)

    def keep_outbox(self, within: Optional[str], entries: list[OutboxEntry]) -> None:
        with self._ops_lock:
            self.prefetched = (within, entries, -1)

    def take_outbox(self, within: Optional[str]) -> Optional[list[OutboxEntry]]:
        """The kept entries if this is the next operation after the read that kept them
        (only its own start counted since) for the same `within`; they go either way."""
        with self._ops_lock:
            kept, self.prefetched = self.prefetched, None
            if kept is not None and kept[0] == within and kept[2] == self.ops - 1:
                return kept[1]
            return None

    def remember(self, owners: dict[int, str]) -> None:
        if len(self.owners) + len(owners) > _OWNERS_MAX:
            self.owners.clear()  # only hints: an ack without one finds its entry by index
        self.owners.update(owners)


# --- set-up -------------------------------------------------------------------------------


def setup(st: StoreState) -> Flow[None]:
    """Indexes (when create_schema) and the layout check. The seq lease is taken on the
    first mint, so a store that only reads never holds one."""
    marker = yield FindOne("counters", {"_id": SCHEMA_MARKER_ID})
    if marker is not None and marker.get("n") != SCHEMA_VERSION:
        # before any index is created: another layout's indexes are its migration's business
        raise SchemaMismatch(int(marker.get("n") or 0), SCHEMA_VERSION, st.where)
    if st.create_schema:
        yield CreateIndexes("executions", st.indexes)
    if marker is None:
        some = yield FindOne("executions", {}, {"_id": 1})
        if some is not None:
            st.compat = True
            log.warning(
                "%s holds executions in harel's MongoStore layout; they load and advance, "
                "but listing, relays and timer sweeps scan them until `harel-beanie migrate up` runs",
                st.where,
            )
        elif st.create_schema:
            yield UpdateOne("counters", {"_id": SCHEMA_MARKER_ID}, {"$setOnInsert": {"n": SCHEMA_VERSION}}, upsert=True)
    st.ready = True


# --- seqs: the mint and its lease (the argument is in harel_beanie.seqs) -------------------


def mint_seqs(st: StoreState, count: int, above: int = 0) -> Flow[list[int]]:
    """`count` unique seqs above `above`, extending or taking a lease when the mint needs."""
    if count == 0:
        return []
    for _ in range(_LEASE_ROUNDS):
        seqs = st.mint.take(count, above)
        if seqs is not None:
            return seqs
        want = st.mint.wanted_ms(count, above)
        lease = st.mint.lease
        if lease is None or not (yield from _extend_lease(st, lease, want)):
            yield from _take_lease(st, want)
    raise RuntimeError(f"could not mint seqs in {st.where}: the seq lease keeps being lost")


def _extend_lease(st: StoreState, lease: Lease, want_ms: int) -> Flow[bool]:
    """Raise the lease's recorded `hi` (conditional on still owning it) before using it."""
    hi = extended_hi(lease.hi, st.mint.now_ms(), want_ms)
    expires = st.clock() + LEASE_TTL_S
    held = yield UpdateOne(
        "leases",
        {"_id": lease_id(lease.node), "owner": lease.owner},
        {"$max": {"hi": hi}, "$set": {"expires": expires}},
    )
    if held:
        st.mint.install(replace(lease, hi=hi, expires=expires))
        return True
    st.mint.drop(lease)  # taken over after it expired (Rule 5): find another node
    return False


def _take_lease(st: StoreState, want_ms: int) -> Flow[None]:
    """Take a node whose lease is free or expired, starting where the node counter points
    (so instances starting together spread over the nodes) and probing onwards."""
    counter = yield Increment("leases", NODE_COUNTER_ID, "n")
    start = int(counter["n"]) - 1 if counter is not None else int.from_bytes(os.urandom(2), "big")
    harel = yield Find("leases", {"_id": {"$in": list(HAREL_SEQ_COUNTERS)}}, {"n": 1})
    floor_ms = max((ms_floor_above(int(d.get("n") or 0)) for d in harel), default=0)
    for first in range(0, NODES, _LEASE_PROBE):
        nodes = [(start + i) % NODES for i in range(first, first + _LEASE_PROBE)]
        docs = yield Find("leases", {"_id": {"$in": [lease_id(n) for n in nodes]}})
        found = {d["_id"]: d for d in docs}
        for node in nodes:
            doc = found.get(lease_id(node))
            if doc is not None and float(doc.get("expires") or 0) > st.clock():
                continue  # held by a live instance
            if (yield from _claim(st, node, doc, max(floor_ms, want_ms - 1))):
                return
    raise RuntimeError(f"all {NODES} seq nodes of {st.where} are leased by live store instances")


def release_lease(st: StoreState) -> Flow[None]:
    """Give the node back when the store closes, so the next instance can take it at once
    (conditional on still owning it; a crashed instance's lease just expires)."""
    lease = st.mint.lease
    if lease is not None:
        st.mint.drop(lease)
        yield UpdateOne("leases", {"_id": lease_id(lease.node), "owner": lease.owner}, {"$set": {"expires": 0.0}})


def _claim(st: StoreState, node: int, doc: Optional[Mapping[str, Any]], floor_ms: int) -> Flow[bool]:
    """Take `node` over from the lease document read (`doc`, None if it has none yet),
    starting above its recorded `hi`; False if another instance got there first."""
    recorded_hi = int(doc.get("hi") or 0) if doc is not None else 0
    lo, hi = new_range(recorded_hi, st.mint.now_ms(), floor_ms)
    lease = Lease(node, lo, hi, os.urandom(8).hex(), st.clock() + LEASE_TTL_S)
    mine = {"_id": lease_id(node), "node": node, "owner": lease.owner, "hi": hi, "expires": lease.expires}
    try:
        if doc is None:
            yield InsertOne("leases", mine)
        elif not (
            yield UpdateOne(
                "leases", {"_id": lease_id(node), "owner": doc.get("owner"), "hi": doc.get("hi")}, {"$set": mine}
            )
        ):
            return False
    except DuplicateKeyError:
        return False
    except ConnectionFailure:
        # the write may have landed: only the owner recorded now can tell
        now = yield FindOne("leases", {"_id": lease_id(node)})
        if now is None or now.get("owner") != lease.owner:
            return False
    st.mint.install(lease)
    return True


# --- reads --------------------------------------------------------------------------------


def load(st: StoreState, execution_id: str) -> Flow[Optional[Execution]]:
    doc = yield FindOne("executions", {"_id": require_str("execution id", execution_id)}, projection(LoadView))
    return records.execution(doc)


def load_for_event(st: StoreState, execution_id: str, event_id: str) -> Flow[tuple[Optional[Execution], bool]]:
    """The execution and whether it already processed `event_id`, in one round trip: the
    `$elemMatch` projection returns at most the one matching id, never the whole window.
    "Already processed" makes harel drop the event, so it is confirmed by a `confirm` read
    (majority on a replica set) before it is believed: a mark that a failover could still
    roll back must not lose the event. That second read happens only for a duplicate."""
    keys = dedupe_keys(require_str("event id", event_id))
    if st.in_memory:
        # mongomock has no `$elemMatch` projection of a scalar array; in memory, the whole
        # window costs no transfer (and there is no replica set to confirm against)
        proj = {**projection(LoadView), "processed": 1}
        doc = yield FindOne("executions", {"_id": require_str("execution id", execution_id)}, proj)
        exe = records.execution(doc)
        return exe, exe is not None and any(k in (doc or {}).get("processed", ()) for k in keys)
    proj = {**projection(LoadView), "processed": {"$elemMatch": {"$in": keys}}}
    doc = yield FindOne("executions", {"_id": require_str("execution id", execution_id)}, proj)
    exe = records.execution(doc)
    if exe is None or not (doc or {}).get("processed"):
        return exe, False
    return exe, (yield from is_processed(st, execution_id, event_id))


def is_processed(st: StoreState, execution_id: str, event_id: str) -> Flow[bool]:
    # a point read by _id projecting the one matching id, as load_for_event does: cheaper
    # on some servers than a filter on the array; a `confirm` read, as it decides a drop
    keys = dedupe_keys(require_str("event id", event_id))
    if st.in_memory:  # no `$elemMatch` projection in mongomock: the filter on the array
        query = {"_id": require_str("execution id", execution_id), "processed": {"$in": keys}}
        return (yield FindOne("executions", query, {"_id": 1})) is not None
    proj = {"_id": 1, "processed": {"$elemMatch": {"$in": keys}}}
    doc = yield FindOne("confirm", {"_id": require_str("execution id", execution_id)}, proj)
    return bool(doc and doc.get("processed"))


def list_executions(
    st: StoreState,
    status: Optional[Iterable[Status]],
    definition_id: Optional[str],
    roots_only: bool,
    limit: int,
    cursor: Optional[str],
) -> Flow[ExecutionPage]:
    q = listing_query(status, definition_id, roots_only, limit, cursor, compat=st.compat)
    docs = yield Find("executions", q.filter, q.projection, sort=[("_id", 1)], limit=q.limit)
    return listing_page(q, docs)


def read_trace(st: StoreState, execution_id: str) -> Flow[list[dict[str, Any]]]:
    doc = yield FindOne("executions", {"_id": require_str("execution id", execution_id)}, projection(TraceView))
    return records.trace_steps(doc)


def ids_with_prefix(st: StoreState, prefix: str) -> Flow[list[str]]:
    docs = yield Find("executions", prefix_range(prefix), {"_id": 1, "tomb": 1})
    return [d["_id"] for d in docs if "tomb" not in d]


# --- the commit ---------------------------------------------------------------------------


def commit(
    st: StoreState,
    exe: Execution,
    emits: list[tuple[Optional[str], Event]],
    processed_event_id: Optional[str] = None,
    timers: tuple[TimerOp, ...] = (),
    spawns: tuple[tuple[str, str, dict[str, Any]], ...] = (),
    trace: Optional[dict[str, Any]] = None,
    step: Optional[Step] = None,
) -> Flow[list[int]]:
    """One write: the CAS update (or the insert of a new execution). A second round trip
    happens only when the write did not land, or its reply was lost, to learn why.

    A lost reply (the connection dropped, the server timed the operation out) leaves
    the outcome unknown: the write may have been applied. The rule: the commit is reported
    as landed if its token is among the execution's last `COMMIT_TOKENS` commit tokens (or
    a tombstone's buried creations) when read back, whoever committed after it; if the
    stored version is still the loaded one it was not applied and is sent again (the CAS
    admits one application); otherwise it is a `StoreConflict`."""
    floor = 0
    retries_left = UNKNOWN_OUTCOME_RETRIES
    unsure: dict[str, CommitPlan] = {}  # sends whose outcome we never learned, by token
    plan: Optional[CommitPlan] = None
    over: Optional[dict[str, Any]] = None  # a purged incarnation's tombstone the creation replaces
    tomb_tries = _TOMB_TRIES
    while True:
        if plan is None:
            seqs = yield from mint_seqs(st, len(emits) + len(spawns), above=floor)
            plan = plan_commit(
                exe, emits, processed_event_id, timers, spawns, trace, seqs=seqs,
                trace_max=st.trace_max, trace_step_bytes=st.trace_step_bytes, dedupe_window=st.dedupe_window,
            )  # fmt: skip
            _check_budget(st, exe, plan)
        landed = False
        lost: Optional[PyMongoError] = None
        try:
            if plan.insert is None:
                landed = (yield UpdateOne("executions", plan.filter, plan.update)) == 1
            elif over is None:
                yield InsertOne("executions", plan.insert)
                landed = True
            else:
                # the id was purged before: a creation (harel's create of a reused id)
                # replaces exactly the tombstone read, carrying its buried creations on
                replacement = {**plan.insert, "buried": over.get("buried", [])}
                landed = (yield ReplaceOne("executions", {"_id": exe.id, "tomb": over}, replacement)) == 1
        except DuplicateKeyError:
            pass  # a concurrent creator won the insert, an earlier send of ours did, or a tombstone
        except DocumentTooLarge:
            raise (yield from _too_large(st, exe, plan)) from None
        except WriteError as err:
            if err.code in _TOO_LARGE_CODES:
                raise (yield from _too_large(st, exe, plan)) from None
            raise
        except (ConnectionFailure, ExecutionTimeout) as err:
            lost = err
            unsure[plan.token] = plan
        if landed:
            return _landed(st, exe, plan)
        found = yield from _read_version(exe.id, lost)
        mine = _token_found(found, unsure)
        if mine is not None:
            # an earlier send landed, perhaps after we stopped waiting for it, perhaps
            # followed by other commits, or by a purge
            return _landed(st, exe, unsure[mine])
        tomb = None if found is None else found.get("tomb")
        if tomb is not None and plan.insert is not None:
            # a creation meeting a tombstone: ours never landed (its token would be buried
            # there), so replace that tombstone, sent like any write (lost replies included)
            if lost is not None:
                if not retries_left:
                    raise lost
                retries_left -= 1
            elif not tomb_tries:
                raise StoreConflict(exe.id, expected=plan.old_version, found=None)
            else:
                tomb_tries -= 1  # the tombstone changed under us (another purge): look again
            over = tomb
            continue
        stored = None if found is None or tomb is not None else found.get("version")
        expected = None if plan.insert is not None else plan.old_version
        if lost is not None and stored == expected:
            if not retries_left:
                raise lost
            retries_left -= 1
            continue  # not applied (yet): send the same write again; the CAS admits one
        hi = None if found is None else found.get("seq_hi")
        if plan.insert is None and stored == plan.old_version and hi is not None and hi > floor:
            floor = hi  # our clock is behind this execution's last seq: mint above it, retry
            plan = None
            continue
        raise StoreConflict(exe.id, expected=plan.old_version, found=stored)


def _token_found(found: Optional[Mapping[str, Any]], unsure: Mapping[str, CommitPlan]) -> Optional[str]:
    """The token of one of our unsure sends that the stored document shows landed."""
    if found is None or not unsure:
        return None
    seen = list(found.get("commit_tokens") or ()) + list((found.get("tomb") or {}).get("buried") or ())
    return next((t for t in seen if t in unsure), None)


def _landed(st: StoreState, exe: Execution, plan: CommitPlan) -> list[int]:
    exe.version = plan.old_version + 1
    st.remember({s: exe.id for s in plan.seqs + plan.spawn_seqs})
    return plan.seqs


def _read_version(execution_id: str, lost: Optional[PyMongoError]) -> Flow[Optional[dict[str, Any]]]:
    """The stored version, seq floor, recent commit tokens (or the tombstone), read at the
    `confirm` level: it may decide that a commit landed. After a lost reply the server may
    still be unreachable for a moment: try a few times before giving up with the original
    error (the caller then knows nothing was confirmed, and harel redelivers)."""
    attempts = UNKNOWN_OUTCOME_RETRIES + 1 if lost is not None else 1
    for attempt in range(attempts):
        try:
            return (yield FindOne("confirm", {"_id": execution_id}, projection(VersionView)))
        except (ConnectionFailure, ExecutionTimeout):
            if attempt == attempts - 1:
                if lost is not None:
                    raise lost from None
                raise
    return None


def _check_budget(st: StoreState, exe: Execution, plan: CommitPlan) -> None:
    """Refuse, before sending, an execution whose own JSON takes more than the store leaves
    it once its trace ring and dedupe window are full, naming what is large."""
    budget = data_budget(st.trace_max, st.trace_step_bytes, st.dedupe_window)
    if plan.data_bytes > budget:
        parts = {"the execution's JSON": plan.data_bytes, "of which its context": _json_bytes(exe.context)}
        raise ExecutionTooLarge(exe.id, plan.data_bytes, budget, parts=parts, reserved=MAX_DOCUMENT_BYTES - budget)


def _too_large(st: StoreState, exe: Execution, plan: CommitPlan) -> Flow[ExecutionTooLarge]:
    """The server refused the commit for the document's size: read what the document holds
    now (one more round trip, on this failure only) to say which part is large."""
    parts = {"the execution's JSON": plan.data_bytes, "this commit's new outbox entries and spawns": plan.new_bytes}
    held = {
        "outbox": "pending outbox",
        "spawns": "pending spawns",
        "trace": "trace ring",
        "processed": "dedupe window",
        "timers": "timers",
    }
    doc = yield FindOne("executions", {"_id": exe.id}, {key: 1 for key in held})
    for key, name in held.items():
        if doc and doc.get(key):
            parts[name] = len(bson.encode({"v": doc[key]}))
    reserved = reserved_bytes(st.trace_max, st.trace_step_bytes, st.dedupe_window)
    return ExecutionTooLarge(exe.id, sum(parts.values()), MAX_DOCUMENT_BYTES, parts=parts, reserved=reserved)


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), default=str).encode())


def append_trace(st: StoreState, execution_id: str, entry: dict[str, Any]) -> Flow[None]:
    query = {"_id": require_str("execution id", execution_id), **NOT_A_TOMBSTONE}
    yield UpdateOne("executions", query, append_trace_update(entry, st.trace_max, st.trace_step_bytes))


# --- relays and sweeps --------------------------------------------------------------------


class _Unknown:
    """The parent of a document not read yet (or written by harel's store, not migrated)."""


_UNKNOWN = _Unknown()


def _parent_of(doc: Mapping[str, Any]) -> Optional[str] | _Unknown:
    """A document's parent id: the promoted field, else (a document harel's store wrote)
    the one inside `data`, else unknown."""
    if "parent_id" in doc:
        parent = doc["parent_id"]
        return parent if parent is None or isinstance(parent, str) else None
    if isinstance(doc.get("data"), str):
        parent = json.loads(doc["data"]).get("parent_id")
        return parent if isinstance(parent, str) else None
    return _UNKNOWN


def in_tree(
    execution_id: str, parents: Mapping[str, Optional[str] | _Unknown]
) -> Callable[[str], Optional[bool] | str]:
    """Whether the execution with a given id is `execution_id` or one of its descendants,
    decided by the `parent_id` chain in `parents` (id -> parent id): True, False, or the id
    of the ancestor whose parent must be read first.

    An id says nothing by itself: a user may name a root `a:b`, which is no child of `a`.
    It only rules out: harel names every child `<parent id>:<path>:<n>`, so the id of each
    descendant, and of each ancestor between it and `execution_id`, starts with
    `execution_id + ":"`. A chain leaving that prefix, ending at a root or at a document
    that no longer exists is outside the tree."""
    below = execution_id + ":"
    verdicts: dict[str, bool] = {execution_id: True}

    def decide(doc_id: str) -> Optional[bool] | str:
        chain: list[str] = []
        at: Optional[str] = doc_id
        while True:
            if at is not None and at in verdicts:
                verdict = verdicts[at]
                break
            if at is None or not at.startswith(below) or at in chain:
                verdict = False  # a root, another tree, or a cycle (never written by harel)
                break
            parent = parents.get(at, _UNKNOWN)
            if isinstance(parent, _Unknown):
                return at  # read its parent, then ask again
            chain.append(at)
            at = parent
        for member in chain:
            verdicts[member] = verdict
        return verdict

    return decide


def tree_docs(st: StoreState, within: Optional[str], docs: list[dict[str, Any]]) -> Flow[list[dict[str, Any]]]:
    """The documents among `docs` (each with `_id` and, promoted, `parent_id`) that are
    `within` or its descendants; all of them for None.

    The parent of each document is in `docs` already, so a child of `within`, or a
    descendant whose ancestors below `within` hold pending work too, is decided without
    I/O. Only an id that starts like a descendant's but whose parent is neither `within`
    nor among `docs` costs a read: one `_id` point read of the missing ancestors per level
    of the tree, projecting their parent only."""
    if within is None:
        return docs
    require_str("execution id", within)
    below = within + ":"
    candidates = [d for d in docs if d["_id"] == within or str(d["_id"]).startswith(below)]
    if not candidates:
        return []
    parents: dict[str, Optional[str] | _Unknown] = {d["_id"]: _parent_of(d) for d in docs}
    decide = in_tree(within, parents)
    proj = {"parent_id": 1, "data": 1} if st.compat else {"parent_id": 1}
    while True:
        verdicts = {d["_id"]: decide(d["_id"]) for d in candidates}
        missing = sorted({v for v in verdicts.values() if isinstance(v, str)})
        if not missing:
            return [d for d in candidates if verdicts[d["_id"]] is True]
        found = yield Find("executions", {"_id": {"$in": missing}}, proj)
        for doc_id in missing:
            parents[doc_id] = None  # gone (purged): the chain ends outside the tree
        for doc in found:
            parent = _parent_of(doc)
            parents[doc["_id"]] = None if isinstance(parent, _Unknown) else parent


def pending_outbox(st: StoreState, within: Optional[str] = None) -> Flow[list[OutboxEntry]]:
    kept = st.take_outbox(within)
    if kept is not None:
        return kept  # read by the pending_spawns just before (see the module docstring)
    query = {"outbox.seq": ANY_SEQ} if st.compat else PENDING
    docs = yield Find("executions", query, projection(OutboxView))
    entries, owners = records.outbox_entries((yield from tree_docs(st, within, docs)))
    st.remember(owners)
    return entries


def ack_outbox(st: StoreState, seq: int) -> Flow[None]:
    yield from _ack(st, "outbox", seq)


def pending_spawns(st: StoreState, within: Optional[str] = None) -> Flow[list[SpawnEntry]]:
    if st.compat:  # harel's documents carry no `pending` flag: each array by itself
        docs = yield Find("executions", {"spawns.seq": ANY_SEQ}, projection(SpawnView))
        entries, owners = records.spawn_entries((yield from tree_docs(st, within, docs)))
        st.remember(owners)
        return entries
    # one read for both kinds: the relay asks for the outbox next (see the module docstring)
    found = yield Find("executions", PENDING, projection(PendingView))
    docs = yield from tree_docs(st, within, found)
    entries, owners = records.spawn_entries(docs)
    outbox, outbox_owners = records.outbox_entries(docs)
    st.remember({**owners, **outbox_owners})
    st.keep_outbox(within, outbox)
    return entries


def ack_spawn(st: StoreState, seq: int) -> Flow[None]:
    yield from _ack(st, "spawns", seq)


def _ack(st: StoreState, array: str, seq: int) -> Flow[None]:
    """Remove entry `seq` from the document holding it, addressed by `_id`: this store knows
    the owner of every entry it committed or read (the relay reads before it acks). An
    entry never leaves the document it was committed in, so `_id` is enough; the seq rides
    along so a document no longer holding it (acked already, purged) is not written at all.
    Without the owner (another instance read it), one read through the pending index finds
    it first. By `_id` is the cheapest write there is: mongod's `_id` fast path, and on a
    sharded cluster routed to one shard."""
    require_int("seq", seq)
    entry = {f"{array}.seq": seq}
    if st.compat or st.in_memory:  # no `pending` flag to go by (compat), or no index (mongomock)
        owner = st.owners.pop(seq, None)
        yield from _remove_entries(st, array, {"_id": owner, **entry} if owner else entry, {"seq": seq}, many=False)
        return
    owner = st.owners.pop(seq, None)
    if owner is None:
        docs = yield Find("executions", PENDING, {array: {"$elemMatch": {"seq": seq}}})
        owner = next((d["_id"] for d in docs if d.get(array)), None)
        if owner is None:
            return  # no document holds it: acked already
    # one-element `$in`s: the same plan on mongod, no index planning on SecantusDB (commit.point)
    yield from _remove_entries(st, array, {"_id": point(owner), f"{array}.seq": point(seq)}, {"seq": seq}, many=False)


_HOLDS_ENTRIES = {
    "$or": [
        {"$gt": [{"$size": {"$ifNull": ["$outbox", []]}}, 0]},
        {"$gt": [{"$size": {"$ifNull": ["$spawns", []]}}, 0]},
    ]
}


def _remove_entries(
    st: StoreState, array: str, query: dict[str, Any], match: dict[str, Any], *, many: bool
) -> Flow[None]:
    """Remove the entries of `array` matching `match` (field -> value) from the documents
    `query` selects, and in the same write clear `pending` if that took their last entry:
    an update pipeline, so the flag can't disagree with the arrays. mongomock evaluates
    such pipelines wrongly, so in memory it is a `$pull` and the flag may stay set (it
    only costs a look at a document with nothing left, never a missed entry)."""
    update: Any
    if st.in_memory:
        update = {"$pull": {array: match}}
    else:
        # `$literal`: inside an expression a string starting with `$` would be a field path
        # (an execution id may be "$a"), never the value itself
        keep = {"$or": [{"$ne": [f"$$this.{k}", {"$literal": v}]} for k, v in match.items()]}
        update = [
            {"$set": {array: {"$filter": {"input": {"$ifNull": [f"${array}", []]}, "cond": keep}}}},
            {"$set": {"pending": {"$cond": [_HOLDS_ENTRIES, True, "$$REMOVE"]}}},
        ]
    if many:
        yield UpdateMany("executions", query, update)
    else:
        yield UpdateOne("executions", query, update)


def due_timers(st: StoreState, now: float) -> Flow[list[tuple[str, str, float]]]:
    # the lower bound names the partial timer index's filter (see documents.py)
    due_now: dict[str, Any] = {"next_fire": {**ANY_TIME, "$lte": require_time("now", now, infinite_ok=True)}}
    if st.compat:
        # harel's documents carry no bound, and a commit of ours sets one from its own
        # timers only: until the database is migrated, every document with a timer is read
        due_now = {"$or": [due_now, {"timers": {"$nin": [{}, None]}}]}
    docs = yield Find("executions", due_now, projection(TimerView))
    due, repairs = records.due_timers(docs, now)
    for fix in repairs:
        yield UpdateOne("executions", fix["filter"], fix["update"])
    return due


def delete_timer(st: StoreState, execution_id: str, path: str, fire_at: float) -> Flow[None]:
    """Remove the timer if it still holds `fire_at`, and reset the execution's `next_fire`
    to its earliest remaining timer in the same write (an update pipeline)."""
    key = timer_field(path)
    guard = {"_id": require_str("execution id", execution_id), key: require_time("fire_at", fire_at)}
    if st.in_memory:
        # mongomock evaluates this pipeline wrongly: remove the timer alone, and the bound,
        # left too low, is raised by the next sweep (as after a cancel)
        yield UpdateOne("executions", guard, {"$unset": {key: ""}})
        return
    earliest: dict[str, Any] = {
        "$min": {"$map": {"input": {"$objectToArray": {"$ifNull": ["$timers", {}]}}, "in": "$$this.v"}}
    }
    earliest = {"$ifNull": [earliest, "$$REMOVE"]}  # none left: no bound at all, never a null one
    yield UpdateOne("executions", guard, [{"$project": {key: 0}}, {"$set": {"next_fire": earliest}}])


def purge(st: StoreState, execution_id: str, expected_version: int) -> Flow[bool]:
    """Replace the execution, if still at `expected_version`, by its tombstone (see the
    module docstring), then pull the entries other executions addressed to it. A purge of
    an execution that moved on touches nothing."""
    require_str("execution id", execution_id)
    require_int("expected version", expected_version)
    doc = yield FindOne("executions", {"_id": execution_id}, {"version": 1, "born": 1, "buried": 1, "tomb": 1})
    purged = False
    if doc is not None and "tomb" not in doc:
        if doc.get("version") != expected_version:
            return False  # it moved on: touch nothing
        born = [doc["born"]] if doc.get("born") else []  # harel's documents carry none
        buried = (list(doc.get("buried") or ()) + born)[-_BURIED_MAX:]
        tomb = {"_id": execution_id, "tomb": {"at": st.clock(), "buried": buried}}
        guard = {"_id": execution_id, "version": expected_version, "born": doc.get("born")}
        purged = bool((yield ReplaceOne("executions", guard, tomb)))
        if not purged:
            now = yield FindOne("executions", {"_id": execution_id}, {"tomb": 1})
            if now is not None and "tomb" not in now:
                return False  # it moved on between the read and the write
            # buried meanwhile (an earlier send of this purge, landing late): finish the job
    # entries other executions addressed to it (the ones it issued went with its document)
    # only documents holding entries can hold one for it: the seq index finds those, and the
    # pull is addressed by _id (an index on target_id would cost every commit with an emit,
    # for the sake of a rare purge)
    pending = yield Find("executions", {"outbox.seq": ANY_SEQ} if st.compat else PENDING, {"outbox.target_id": 1})
    holders = [d["_id"] for d in pending if any(e.get("target_id") == execution_id for e in d.get("outbox") or ())]
    if holders:
        query = {"_id": {"$in": holders}, "outbox.target_id": execution_id}
        yield from _remove_entries(st, "outbox", query, {"target_id": execution_id}, many=True)
    if st.compat:
        yield DeleteOne("counters", {"_id": "trace:" + execution_id})  # harel's trace counter
    return purged
