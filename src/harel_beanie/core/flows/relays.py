"""What harel's relays and timer sweep ask: pending entries, their acks, due timers.

`within` scopes a relay to one execution and its descendants (`tree_docs`, by the
`parent_id` chain). An ack removes one entry addressed by `_id` and clears the `pending`
flag with it; `remove_entries` is that write, also used by a purge.

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
tests/store/test_structure.py (`test_relay_pass_*`) checks the round trip saved and that a
commit, an ack or another `within` in between is seen.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Optional

from harel.engine.store.base import OutboxEntry, SpawnEntry

from harel_beanie.core import records
from harel_beanie.core.arguments import require_int, require_str, require_time
from harel_beanie.core.calls import Find, Flow, UpdateMany, UpdateOne
from harel_beanie.core.counting import DIRTY
from harel_beanie.core.documents import PENDING, OutboxView, PendingView, SpawnView, TimerView, projection
from harel_beanie.core.flows.state import StoreState
from harel_beanie.core.keys import ANY_SEQ, ANY_TIME, point, timer_field


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
    within = require_str("within", within)
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


def pending_query(st: StoreState, within: Optional[str]) -> Optional[dict[str, Any]]:
    """What a relay reads (the flagged documents): with `within`, that execution's own
    family by key, in its partition: O(the family's pending work) however much else is
    pending; without, the partitions this store works on (None: it owns none now)."""
    if within is not None:
        family = st.scope.family_filter(require_str("within", within), partitioned=not st.unpartitioned)
        return {**PENDING, **family}
    scoped = st.scope.sweep_filter()
    return None if scoped is None else {**PENDING, **scoped}


def pending_outbox(st: StoreState, within: Optional[str] = None) -> Flow[list[OutboxEntry]]:
    kept = st.take_outbox(within)
    if kept is not None:
        return kept  # read by the pending_spawns just before (see the module docstring)
    if st.compat:
        docs = yield Find("executions", {"outbox.seq": ANY_SEQ}, projection(OutboxView))
    else:
        query = pending_query(st, within)
        docs = [] if query is None else (yield Find("executions", query, projection(OutboxView)))
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
    query = pending_query(st, within)
    found = [] if query is None else (yield Find("executions", query, projection(PendingView)))
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
    seq = require_int("seq", seq)
    entry = {f"{array}.seq": seq}
    if st.compat or st.in_memory:  # no `pending` flag to go by (compat), or no index (mongomock)
        owner = st.owners.pop(seq, None)
        yield from remove_entries(st, array, {"_id": owner, **entry} if owner else entry, {"seq": seq}, many=False)
        return
    owner = st.owners.pop(seq, None)
    if owner is None:
        docs = yield Find("executions", PENDING, {array: {"$elemMatch": {"seq": seq}}})
        owner = next((d["_id"] for d in docs if d.get(array)), None)
        if owner is None:
            return  # no document holds it: acked already
    # one-element `$in`s: the same plan on mongod, no index planning on SecantusDB (keys.point)
    yield from remove_entries(st, array, {"_id": point(owner), f"{array}.seq": point(seq)}, {"seq": seq}, many=False)


_HOLDS_ENTRIES = {
    "$or": [
        {"$gt": [{"$size": {"$ifNull": ["$outbox", []]}}, 0]},
        {"$gt": [{"$size": {"$ifNull": ["$spawns", []]}}, 0]},
    ]
}


def remove_entries(
    st: StoreState, array: str, query: dict[str, Any], match: dict[str, Any], *, many: bool
) -> Flow[None]:
    """Remove the entries of `array` matching `match` (field -> value) from the documents
    `query` selects, and in the same write clear `pending` if that took their last entry:
    an update pipeline, so the flag can't disagree with the arrays. mongomock evaluates
    such pipelines wrongly, so in memory it is a `$pull` and the flag may stay set (it
    only costs a look at a document with nothing left, never a missed entry)."""
    update: Any
    if st.in_memory:
        update = {"$pull": {array: match}, "$set": {DIRTY: True}}
    else:
        # `$literal`: inside an expression a string starting with `$` would be a field path
        # (an execution id may be "$a"), never the value itself
        keep = {"$or": [{"$ne": [f"$$this.{k}", {"$literal": v}]} for k, v in match.items()]}
        update = [
            {"$set": {array: {"$filter": {"input": {"$ifNull": [f"${array}", []]}, "cond": keep}}}},
            # the last entry gone, the execution may wait on nothing: the fold decides (core.stuck)
            {"$set": {"pending": {"$cond": [_HOLDS_ENTRIES, True, "$$REMOVE"]}, DIRTY: True}},
        ]
    if many:
        yield UpdateMany("executions", query, update)
    else:
        yield UpdateOne("executions", query, update)


def due_timers(st: StoreState, now: float) -> Flow[list[tuple[str, str, float]]]:
    # the lower bound names the partial timer index's filter (see documents.py)
    due_now: dict[str, Any] = {"next_fire": {**ANY_TIME, "$lte": require_time("now", now, infinite_ok=True)}}
    scoped = st.scope.sweep_filter()
    if scoped is None:
        return []  # it owns no partition now: another worker sweeps them
    if st.compat:
        # harel's documents carry no bound, and a commit of ours sets one from its own
        # timers only: until the database is migrated, every document with a timer is read
        due_now = {"$or": [due_now, {"timers": {"$nin": [{}, None]}}]}
    due_now.update(scoped)
    docs = yield Find("executions", due_now, projection(TimerView))
    due, repairs = records.due_timers(docs, now)
    for fix in repairs:
        yield UpdateOne("executions", fix["filter"], fix["update"])
    return due


def next_timer(st: StoreState, after: float) -> Flow[Optional[float]]:
    """The earliest timer bound later than `after`, if any: when an idle worker should next
    sweep for due timers. One read of one key through the partial timer index (a bound may
    be stale, after a cancel: the sweep it wakes then finds nothing, and sets it right)."""
    later = {"next_fire": {**ANY_TIME, "$gt": require_time("after", after)}}
    scoped = st.scope.sweep_filter()
    if scoped is None:
        return None
    later.update(scoped)
    docs = yield Find("executions", later, {"_id": 0, "next_fire": 1}, sort=[("next_fire", 1)], limit=1)
    return float(docs[0]["next_fire"]) if docs else None


def delete_timer(st: StoreState, execution_id: str, path: str, fire_at: float) -> Flow[None]:
    """Remove the timer if it still holds `fire_at`, and reset the execution's `next_fire`
    to its earliest remaining timer in the same write (an update pipeline)."""
    key = timer_field(path)
    guard = {"_id": require_str("execution_id", execution_id), key: require_time("fire_at", fire_at)}
    if st.in_memory:
        # mongomock evaluates this pipeline wrongly: remove the timer alone, and the bound,
        # left too low, is raised by the next sweep (as after a cancel)
        yield UpdateOne("executions", guard, {"$unset": {key: ""}, "$set": {DIRTY: True}})
        return
    earliest: dict[str, Any] = {
        "$min": {"$map": {"input": {"$objectToArray": {"$ifNull": ["$timers", {}]}}, "in": "$$this.v"}}
    }
    earliest = {"$ifNull": [earliest, "$$REMOVE"]}  # none left: no bound at all, never a null one
    # the last timer gone, the execution may wait on nothing: the fold decides (core.stuck)
    yield UpdateOne("executions", guard, [{"$project": {key: 0}}, {"$set": {"next_fire": earliest, DIRTY: True}}])
