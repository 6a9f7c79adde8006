"""The commit: one conditional write, and how a lost reply or a refusal is resolved.

What the write holds is planned, with no I/O, by `harel_beanie.core.commit`; this flow mints
its seqs, sends it, and when it did not land (or its reply was lost) reads back why and
decides: landed after all, send again, mint above a higher seq floor, replace a tombstone
(a reused id), or a `StoreConflict`. A refusal for size becomes an `ExecutionTooLarge`
that names what is large. `append_trace`, the one other write to an execution outside a
commit, sits here because it shares the commit's trace ring and tombstone guard.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional

import bson
from harel.engine.execution import Execution
from harel.engine.store.base import StoreConflict
from pymongo.errors import (
    ConnectionFailure,
    DocumentTooLarge,
    DuplicateKeyError,
    ExecutionTimeout,
    PyMongoError,
    WriteError,
)

from harel_beanie.core.arguments import require_str
from harel_beanie.core.calls import FindOne, Flow, InsertOne, ReplaceOne, UpdateOne
from harel_beanie.core.commit import COMMIT_TOKENS, CommitPlan, CommitRequest, append_trace_update, plan_commit
from harel_beanie.core.counting import COUNTED, COUNTED_SEQ
from harel_beanie.core.documents import VersionView, projection
from harel_beanie.core.errors import ExecutionTooLarge
from harel_beanie.core.flows.leases import mint_seqs
from harel_beanie.core.flows.state import StoreState
from harel_beanie.core.outcome import CommitOutcomeUnknown
from harel_beanie.core.records import timers_held
from harel_beanie.core.sizes import MAX_DOCUMENT_BYTES, data_budget, dedupe_key, reserved_bytes

# the server's codes for a document or update over the size limit
_TOO_LARGE_CODES = {10334, 17419, 17420, 13134}
UNKNOWN_OUTCOME_RETRIES = 3  # re-sends of a commit whose reply was lost and that did not land
_TOMB_TRIES = 3  # replacements of a tombstone that keeps changing (purges racing) before a conflict
NOT_A_TOMBSTONE = {"tomb": {"$exists": False}}


def commit(st: StoreState, request: CommitRequest) -> Flow[list[int]]:
    """One write: the CAS update (or the insert of a new execution). A second round trip
    happens only when the write did not land, or its reply was lost, to learn why.

    A lost reply (the connection dropped, the server timed the operation out) leaves
    the outcome unknown: the write may have been applied. So may a write whose reply says it
    matched nothing: the driver retries a write once by itself where the server supports
    it, and when its first attempt landed after the reply was lost, the retry finds the
    version moved and says so, with no error. The rule, for every write that did not plainly
    land: the commit is reported as landed if the token of any of its sends is among the
    execution's last `COMMIT_TOKENS` commit tokens (or a tombstone's buried creations) when
    read back, whoever committed after it; if the stored version is still the loaded one
    and the reply was lost it was not applied and is sent again (the CAS admits one
    application); if more commits than that window landed since and the event it consumed is
    marked processed, nobody can say whether it landed: `CommitOutcomeUnknown`, a
    connection failure; otherwise it is a `StoreConflict`. (The network-fault runs found the
    retried case and the window outrun: tests/reliability/test_reliability_network.py.)
    Kept whole: the retry loop's cases (landed, conflict, unknown outcome) share the plan and the error they decide on."""
    floor = 0
    retries_left = UNKNOWN_OUTCOME_RETRIES
    sent: dict[str, CommitPlan] = {}  # every send's plan by token: any of them may have landed
    plan: Optional[CommitPlan] = None
    over: Optional[dict[str, Any]] = None  # the stored tombstone (of a purged incarnation) a creation replaces
    tomb_tries = _TOMB_TRIES
    pin = True  # until a pinned send misses on its pins (core.commit)
    exe = request.exe
    while True:
        if plan is None:
            plan = yield from _plan(st, request, floor, pin)
        sent[plan.token] = plan
        landed, lost = yield from _send(st, exe, plan, over)
        if landed:
            return _landed(st, exe, plan)
        found = yield from _read_version(exe.id, lost)
        mine = _token_found(found, sent)
        if mine is not None:
            # a send of ours landed, perhaps after we stopped waiting for it, perhaps under
            # the driver's own retry, perhaps followed by other commits, or by a purge
            return _landed(st, exe, sent[mine])
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
            over = found
            continue
        stored = None if found is None or tomb is not None else found.get("version")
        expected = None if plan.insert is not None else plan.old_version
        if lost is not None and stored == expected:
            if not retries_left:
                raise lost
            retries_left -= 1
            continue  # not applied (yet): send the same write again; the CAS admits one
        hi = None if found is None else found.get("seq_hi")
        if plan.pinned and stored == plan.old_version:
            # at the version loaded, so one of its pins (what it is counted as, what its
            # `quiet` assumed: core.commit) or the seq floor did not hold: sent again
            # unpinned, marked for the fold, above the stored seqs
            pin, plan = False, None
            floor = max(floor, hi or 0)
            continue
        if plan.insert is None and stored == plan.old_version and hi is not None and hi > floor:
            floor = hi  # our clock is behind this execution's last seq: mint above it, retry
            plan = None
            continue
        if plan.insert is None and stored is not None and stored - plan.old_version > COMMIT_TOKENS:
            # more commits than the token window landed since: ours may have been one of
            # them, its token pushed out (a reply lost in a partition while other workers
            # committed on)
            if (yield from _maybe_landed(st, exe.id, request.processed_event_id, lost, stored - plan.old_version)):
                raise CommitOutcomeUnknown(exe.id, plan.old_version, stored) from lost
        raise StoreConflict(exe.id, expected=plan.old_version, found=stored)


def _maybe_landed(
    st: StoreState, execution_id: str, event_id: Optional[str], lost: Optional[PyMongoError], since: int
) -> Flow[bool]:
    """Whether a commit whose token is no longer in the window may still have landed, `since`
    commits having landed after the version it was loaded at. Its event's mark in the dedupe
    window settles it when absent, while that window is longer than `since`: had the commit
    landed, the mark would still be there. Present, it may be ours or another worker's for
    the same event: unknown. A commit that consumed no event can only be judged by its
    reply: lost, unknown."""
    if event_id is None:
        return lost is not None
    if since > st.dedupe_window:
        return True  # its mark may have been pushed out of the dedupe window as well
    marked = yield FindOne("confirm", {"_id": execution_id, "processed": dedupe_key(event_id)}, {"_id": 1})
    return marked is not None


def _plan(st: StoreState, request: CommitRequest, floor: int, pin: bool = True) -> Flow[CommitPlan]:
    """Mint the commit's seqs above `floor` and plan its write, refused before it is sent
    if the execution would not fit once the store's own additions are full."""
    seqs = yield from mint_seqs(st, len(request.emits) + len(request.spawns), above=floor)
    armed = yield from _armed(st, request)
    plan = plan_commit(
        request,
        seqs=seqs,
        trace_max=st.trace_max,
        trace_step_bytes=st.trace_step_bytes,
        dedupe_window=st.dedupe_window,
        part_of=st.scope.part_of,
        # not on harel's layout (not migrated): its documents may lack the promoted status
        # and the `pending` flag a pin would check, so a commit there is marked, as before
        pin=pin and not st.compat,
        waited=st.waited(request.exe.id, request.exe.version),
        armed=armed,
    )
    _check_budget(st, request.exe, plan)
    return plan


def _armed(st: StoreState, request: CommitRequest) -> Flow[Optional[dict[str, float]]]:
    """The timers the execution held at the version loaded, for a commit with timer ops (its
    bound: `core.stuck`, Rule T1): the load's hint, else read now (a commit loaded by
    another store instance, or a hint pushed out). Read at another version, they are not
    the loaded version's: a conflict (above it, the CAS would refuse the commit anyway;
    below it, the version loaded is not the stored one's past: the id was created again)."""
    exe = request.exe
    if not request.timers or exe.version == 0 or not isinstance(exe.id, str):
        return None
    armed = st.armed(exe.id, exe.version)
    if armed is not None:
        return armed
    doc = yield FindOne("executions", {"_id": exe.id}, {"version": 1, "timers": 1})
    if doc is None:
        return None  # nothing to update: the CAS refuses it
    if doc.get("version") != exe.version:
        raise StoreConflict(exe.id, expected=exe.version, found=doc.get("version"))
    return timers_held(doc)


def _send(
    st: StoreState, exe: Execution, plan: CommitPlan, over: Optional[dict[str, Any]]
) -> Flow[tuple[bool, Optional[PyMongoError]]]:
    """Send the planned write once: whether it landed, and the error that lost its reply
    if one did (it may have landed then). `over` is the tombstone a creation replaces."""
    try:
        if plan.insert is None:
            return (yield UpdateOne("executions", plan.filter, plan.update)) == 1, None
        if over is None:
            yield InsertOne("executions", plan.insert)
            return True, None
        # the id was purged before: a creation (harel's create of a reused id) replaces
        # exactly the tombstone read, carrying its buried creations on, and what the counts
        # count it as (core.counting, Rule 1: the creation's mark counts it anew)
        tomb, counted = over["tomb"], {k: over.get(k) for k in (COUNTED, COUNTED_SEQ)}
        replacement = {**plan.insert, "buried": tomb.get("buried", [])}
        replacement.update({k: v for k, v in counted.items() if v is not None})
        guard = {"_id": exe.id, "tomb": tomb, **counted}
        return (yield ReplaceOne("executions", guard, replacement)) == 1, None
    except DuplicateKeyError:
        return False, None  # a concurrent creator won the insert, an earlier send of ours did, or a tombstone
    except DocumentTooLarge:
        raise (yield from _too_large(st, exe, plan)) from None
    except WriteError as err:
        if err.code in _TOO_LARGE_CODES:
            raise (yield from _too_large(st, exe, plan)) from None
        raise
    except (ConnectionFailure, ExecutionTimeout) as err:
        return False, err


def _token_found(found: Optional[Mapping[str, Any]], sent: Mapping[str, CommitPlan]) -> Optional[str]:
    """The token of one of our sends that the stored document shows landed."""
    if found is None:
        return None
    seen = list(found.get("commit_tokens") or ()) + list((found.get("tomb") or {}).get("buried") or ())
    return next((t for t in seen if t in sent), None)


def _landed(st: StoreState, exe: Execution, plan: CommitPlan) -> list[int]:
    waited = st.waited(exe.id, plan.old_version)
    if plan.insert is not None:
        waited = (False, False)  # a new document: what it holds is what this commit wrote
    if waited is not None:  # what it waits on now, for the commit after this one
        timers = plan.timers if plan.timers is not None else st.armed(exe.id, plan.old_version)
        timer = waited[1] or plan.armed if plan.timers is None else bool(plan.timers)
        st.loaded(exe.id, plan.old_version + 1, waited[0] or plan.pending, timer, timers)
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
    query = {"_id": require_str("execution_id", execution_id), **NOT_A_TOMBSTONE}
    yield UpdateOne("executions", query, append_trace_update(entry, st.trace_max, st.trace_step_bytes))
