"""The flows of `harel_beanie.core.flows`, driven call by call with no server.

A `Script` plays the database: it checks each call a flow yields against the step it
expects (the call's type, its target, and whatever of its filter, update or document the
step names) and answers with the step's canned reply, or throws the step's driver error into
the flow, as the stores do. A call the script does not expect, a step left unused or a
flow that asks for more than the script holds fails the test naming the call.

Clocks are fixed (`StoreState.clock`, `SeqMint(clock_ms=...)`), and a commit test starts
with a lease already installed, so the seqs a commit mints are known in advance and the
commit's own calls are the only ones it makes. The fail-point tests on a real server
(tests/reliability/test_reliability_*.py) prove the driver and the server; these prove the decisions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, TypeVar

import pytest
from harel.engine.execution import Execution
from harel.engine.store.base import StoreConflict
from harel.spec.states import Event
from pymongo.errors import (
    AutoReconnect,
    ConnectionFailure,
    DocumentTooLarge,
    DuplicateKeyError,
    ExecutionTimeout,
    NetworkTimeout,
    WriteError,
)

from harel_beanie.core import flows
from harel_beanie.core.calls import (
    Call,
    CreateIndexes,
    DeleteOne,
    Find,
    FindOne,
    Flow,
    Increment,
    InsertOne,
    ReplaceOne,
    T,
    UpdateMany,
    UpdateOne,
)
from harel_beanie.core.commit import COMMIT_TOKENS, CommitRequest, point
from harel_beanie.core.documents import (
    NODE_COUNTER_ID,
    PENDING,
    SCHEMA_MARKER_ID,
    SCHEMA_VERSION,
    VersionView,
    projection,
)
from harel_beanie.core.errors import ExecutionTooLarge, SchemaMismatch
from harel_beanie.core.flows import StoreState
from harel_beanie.core.keys import ANY_SEQ, ANY_TIME
from harel_beanie.core.outcome import CommitOutcomeUnknown
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, part_of
from harel_beanie.core.seqs import (
    HAREL_SEQ_COUNTERS,
    LEASE_SPAN_MS,
    LEASE_TTL_S,
    MS_SHIFT,
    NODES,
    SEQ_BITS,
    Lease,
    SeqMint,
    extended_hi,
    lease_id,
    node_of,
)
from harel_beanie.core.sizes import MAX_DOCUMENT_BYTES, data_budget, dedupe_key
from harel_beanie.store.settings import StoreSettings

# --- the scripted executor ------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    """One call a flow must yield: its type, its target (any if None), and the fields named
    (each equal to the value given, or satisfying it when it is a predicate)."""

    kind: type
    target: Optional[str] = None
    fields: Mapping[str, Any] = field(default_factory=dict)

    def mismatch(self, call: Call) -> Optional[str]:
        if not isinstance(call, self.kind):
            return f"type (wanted {self.kind.__name__})"
        if self.target is not None and getattr(call, "target", None) != self.target:
            return f"target (wanted {self.target!r})"
        for name, want in self.fields.items():
            got = getattr(call, name)
            if not (want(got) if callable(want) else got == want):
                return f"{name} (wanted {_short(want)})"
        return None

    def __str__(self) -> str:
        named = ", ".join(f"{k}={_short(v)}" for k, v in self.fields.items())
        return f"{self.kind.__name__}({self.target!r}{', ' + named if named else ''})"


def on(kind: type, target: Optional[str] = None, **fields: Any) -> Expect:
    return Expect(kind, target, fields)


@dataclass(frozen=True)
class Computed:
    """A reply worked out from the call being answered and every call seen so far."""

    fn: Callable[[Call, list[Call]], Any]


Step = tuple[Expect, Any]
C = TypeVar("C")


class Script:
    """Drives a flow through `steps`, each (expected call, reply): the reply is sent back
    in, or thrown in when it is an exception (a driver error)."""

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.seen: list[Call] = []

    def run(self, flow: Flow[T]) -> T:
        send: Any = None
        error: Optional[BaseException] = None
        while True:
            try:
                call = flow.send(send) if error is None else flow.throw(error)
            except StopIteration as done:
                self._all_used(f"returned {_short(done.value)}")
                return done.value  # type: ignore[no-any-return]
            except Exception as exc:
                self._all_used(f"raised {exc!r}")
                raise
            n = len(self.seen) + 1
            if not self.steps:
                raise AssertionError(f"call #{n} was not expected (the script has ended): {_short(call)}")
            expect, reply = self.steps.pop(0)
            why = expect.mismatch(call)
            if why is not None:
                raise AssertionError(f"call #{n}: expected {expect}, got {_short(call)}: wrong {why}")
            self.seen.append(call)
            if isinstance(reply, Computed):
                reply = reply.fn(call, self.seen)
            send, error = (None, reply) if isinstance(reply, BaseException) else (reply, None)

    def _all_used(self, outcome: str) -> None:
        if self.steps:
            raise AssertionError(
                f"the flow {outcome} after {len(self.seen)} calls; "
                f"{len(self.steps)} steps unused, next {self.steps[0][0]}"
            )


def the(kind: type[C], call: Call) -> C:
    """`call`, checked to be a `kind`."""
    assert isinstance(call, kind), f"expected a {kind.__name__}, got {_short(call)}"
    return call


def run(flow: Flow[T], *steps: Step) -> T:
    return Script(*steps).run(flow)


def _short(value: Any, limit: int = 400) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text):,} chars)"


# --- fixtures: fixed clocks, a lease in hand, an execution ----------------------------------

NOW_MS = 90_000_000_000  # the mint's clock (ms of the seq epoch), late 2026
WALL = 1_800_000_000.0  # the wall clock (seconds) for lease expiry and tombstones
NODE = 5  # the node of the lease a commit test starts with
ID = "order-1"


def state(lease: bool = True, **settings: Any) -> StoreState:
    st = StoreSettings(**settings).new_state()
    st.clock = lambda: WALL
    st.mint = SeqMint(clock_ms=lambda: NOW_MS)
    if lease:
        st.mint.install(Lease(NODE, NOW_MS - 1_000, NOW_MS + LEASE_SPAN_MS, "me", WALL + LEASE_TTL_S))
    return st


def seq_at(ms: int, node: int = NODE, n: int = 0) -> int:
    return ms << MS_SHIFT | node << SEQ_BITS | n


def execution(version: int = 3, **fields: Any) -> Execution:
    return Execution(id=ID, definition_id="orders", version=version, **fields)


EMITS: list[tuple[Optional[str], Event]] = [("shipping-1", Event(kind="ship"))]
FIRST_SEQ = seq_at(NOW_MS)  # what the installed lease mints first


def token_of(call: Call) -> str:
    """The commit token a commit write carries."""
    if isinstance(call, InsertOne):
        return str(call.document["commit_tokens"][0])
    if isinstance(call, UpdateOne) and isinstance(call.update, dict):
        return str(call.update["$push"]["commit_tokens"]["$each"][0])
    raise AssertionError(f"not a commit write: {_short(call)}")


MINE = "<the token of the flow's first commit write>"


def stored(doc: Optional[dict[str, Any]]) -> Computed:
    """A read-back of `doc`, where MINE (in `commit_tokens` or a tomb's `buried`) stands for
    the token of the first commit write the flow sent."""

    def fill(call: Call, seen: list[Call]) -> Any:
        if doc is None:
            return None
        first = next(c for c in seen if isinstance(c, (InsertOne, UpdateOne)) and c.target == "executions")
        return _swap(doc, MINE, token_of(first))

    return Computed(fill)


def _swap(value: Any, old: Any, new: Any) -> Any:
    if isinstance(value, dict):
        return {k: _swap(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_swap(v, old, new) for v in value]
    return new if value == old else value


def cas(version: int = 3, first_seq: Optional[int] = FIRST_SEQ) -> Expect:
    """The CAS update of the execution loaded at `version`, minting from `first_seq`: its
    equalities are one-element `$in`s (`keys.point`)."""
    want: dict[str, Any] = {"_id": point(ID), "version": point(version)}
    if first_seq is not None:
        want["seq_hi"] = {"$not": {"$gte": first_seq}}
    return on(UpdateOne, "executions", filter=want, update=lambda u: u["$set"]["version"] == version + 1)


CREATE = on(
    InsertOne,
    "executions",
    document=lambda d: d["_id"] == ID and d["version"] == 1 and d["born"] == d["commit_tokens"][0],
)
READ_BACK = on(FindOne, "confirm", filter={"_id": ID}, projection=projection(VersionView))


def commit(st: StoreState, exe: Execution, *steps: Step, emits: Any = EMITS) -> tuple[list[int], Script]:
    script = Script(*steps)
    return script.run(flows.commit(st, CommitRequest(exe, list(emits), processed_event_id="ev-1"))), script


def assert_landed(st: StoreState, exe: Execution, seqs: list[int], version: int, want: list[int]) -> None:
    assert seqs == want
    assert exe.version == version
    assert all(st.owners[s] == ID for s in want)


# --- the commit: first sends -----------------------------------------------------------------


def test_a_new_execution_is_one_insert() -> None:
    st, exe = state(), execution(version=0)
    seqs, script = commit(st, exe, (CREATE, None))
    assert_landed(st, exe, seqs, 1, [FIRST_SEQ])
    doc = the(InsertOne, script.seen[0]).document
    assert doc["seq_hi"] == FIRST_SEQ and doc["outbox"][0]["seq"] == FIRST_SEQ and doc["processed"] == ["ev-1"]


def test_a_cas_update_that_lands_is_one_write() -> None:
    st, exe = state(), execution()
    seqs, script = commit(st, exe, (cas(), 1))
    assert_landed(st, exe, seqs, 4, [FIRST_SEQ])
    assert the(UpdateOne, script.seen[0]).update["$max"] == {"seq_hi": FIRST_SEQ}  # type: ignore[call-overload]


def test_a_commit_without_emits_mints_nothing_and_guards_no_seq() -> None:
    st, exe = state(lease=False), execution()  # no lease and none taken: no lease calls
    seqs, _ = commit(st, exe, (cas(first_seq=None), 1), emits=[])
    assert_landed(st, exe, seqs, 4, [])


# a CAS that matched nothing, or a creation refused on its id, and what the read-back finds
CONFLICTS = [
    ("another writer moved it on", 3, (cas(), 0), {"_id": ID, "version": 5, "commit_tokens": ["theirs"]}, 5),
    ("it was deleted", 3, (cas(), 0), None, None),
    ("it was purged", 3, (cas(), 0), {"_id": ID, "tomb": {"at": 1.0, "buried": ["b0"]}}, None),
    (
        "another creator won the id",
        0,
        (CREATE, DuplicateKeyError("dup", 11000)),
        {"_id": ID, "version": 1, "commit_tokens": ["theirs"]},
        1,
    ),
]


@pytest.mark.parametrize(
    "loaded, send, found, found_version", [c[1:] for c in CONFLICTS], ids=[c[0] for c in CONFLICTS]
)
def test_a_write_that_does_not_land_is_a_conflict_naming_the_found_version(
    loaded: int, send: Step, found: Optional[dict[str, Any]], found_version: Optional[int]
) -> None:
    st, exe = state(), execution(version=loaded)
    with pytest.raises(StoreConflict) as err:
        commit(st, exe, send, (READ_BACK, stored(found)))
    assert (err.value.expected, err.value.found) == (loaded, found_version)
    assert exe.version == loaded and not st.owners


# --- the commit: a lost reply ---------------------------------------------------------------

LOST = [
    AutoReconnect("connection reset"),
    NetworkTimeout("timed out"),
    ExecutionTimeout("operation exceeded time limit", 50),
]
LOST_IDS = ["AutoReconnect", "NetworkTimeout", "ExecutionTimeout"]

# what the read-back after a lost reply finds, and whether that means the commit landed
LOST_THEN = [
    ("landed", {"_id": ID, "version": 4, "commit_tokens": ["t1", MINE]}, None),
    ("landed, then others committed", {"_id": ID, "version": 7, "commit_tokens": ["t1", MINE, "t5", "t6", "t7"]}, None),
    ("not ours: another writer won", {"_id": ID, "version": 4, "commit_tokens": ["t1", "theirs"]}, 4),
    ("not ours: it was purged", {"_id": ID, "tomb": {"at": 1.0, "buried": ["b0"]}}, None),
]


@pytest.mark.parametrize("lost", LOST, ids=LOST_IDS)
@pytest.mark.parametrize("found, conflict_found", [c[1:] for c in LOST_THEN], ids=[c[0] for c in LOST_THEN])
def test_a_lost_update_reply_is_settled_by_the_token_read_back(
    lost: Exception, found: dict[str, Any], conflict_found: Optional[int]
) -> None:
    st, exe = state(), execution()
    steps = [(cas(), lost), (READ_BACK, stored(found))]
    if "commit_tokens" in found and MINE in found["commit_tokens"]:
        seqs, _ = commit(st, exe, *steps)
        assert_landed(st, exe, seqs, 4, [FIRST_SEQ])
    else:
        with pytest.raises(StoreConflict) as err:
            commit(st, exe, *steps)
        assert err.value.found == conflict_found


@pytest.mark.parametrize("lost", LOST, ids=LOST_IDS)
def test_a_lost_reply_not_applied_resends_the_same_write(lost: Exception) -> None:
    """The stored version is still the loaded one: the very same write (same token, same
    seqs) goes again, and the CAS admits one application."""
    st, exe = state(), execution()
    same = on(UpdateOne, "executions", filter=lambda f: True)
    seqs, script = commit(
        st, exe, (cas(), lost), (READ_BACK, stored({"_id": ID, "version": 3, "commit_tokens": ["t3"]})), (same, 1)
    )
    assert script.seen[2] == script.seen[0] and token_of(script.seen[2]) == token_of(script.seen[0])
    assert_landed(st, exe, seqs, 4, [FIRST_SEQ])


def test_a_lost_creation_not_applied_resends_the_same_insert() -> None:
    st, exe = state(), execution(version=0)
    seqs, script = commit(st, exe, (CREATE, AutoReconnect("reset")), (READ_BACK, None), (CREATE, None))
    assert script.seen[2] == script.seen[0]
    assert_landed(st, exe, seqs, 1, [FIRST_SEQ])


def test_a_lost_creation_found_landed_is_reported_landed() -> None:
    st, exe = state(), execution(version=0)
    seqs, _ = commit(
        st,
        exe,
        (CREATE, NetworkTimeout("t")),
        (READ_BACK, stored({"_id": ID, "version": 2, "commit_tokens": [MINE, "t2"]})),
    )
    assert_landed(st, exe, seqs, 1, [FIRST_SEQ])


def test_a_resend_refused_because_the_lost_send_landed_meanwhile_is_reported_landed() -> None:
    """The first send's reply was lost and the read-back did not see it yet; the resend
    finds the id taken (DuplicateKey) by that very first send."""
    st, exe = state(), execution(version=0)
    seqs, _ = commit(
        st,
        exe,
        (CREATE, AutoReconnect("reset")),
        (READ_BACK, None),
        (CREATE, DuplicateKeyError("dup", 11000)),
        (READ_BACK, stored({"_id": ID, "version": 1, "commit_tokens": [MINE]})),
    )
    assert_landed(st, exe, seqs, 1, [FIRST_SEQ])


def test_a_write_the_driver_retried_after_its_first_attempt_landed_is_reported_landed() -> None:
    """On a replica set the driver re-sends a write once by itself. When the first attempt
    landed and only its reply was lost, the retry finds the version moved and matches
    nothing: the store sees a plain "0 matched", no error. The token read back says the
    commit is ours (the network-fault runs met this: a server paused right after a send)."""
    st, exe = state(), execution()
    seqs, _ = commit(st, exe, (cas(), 0), (READ_BACK, stored({"_id": ID, "version": 4, "commit_tokens": ["t1", MINE]})))
    assert_landed(st, exe, seqs, 4, [FIRST_SEQ])


def test_a_creation_the_driver_retried_into_its_own_id_is_reported_landed() -> None:
    """The same for a creation: the driver's retry of the insert meets the id its own first
    attempt took (DuplicateKey); the token read back says it landed."""
    st, exe = state(), execution(version=0)
    seqs, _ = commit(
        st,
        exe,
        (CREATE, DuplicateKeyError("dup", 11000)),
        (READ_BACK, stored({"_id": ID, "version": 1, "commit_tokens": [MINE]})),
    )
    assert_landed(st, exe, seqs, 1, [FIRST_SEQ])


# the token window outrun: COMMIT_TOKENS + 1 commits landed after the loaded version (3)
OUTRUN = {"_id": ID, "version": 3 + COMMIT_TOKENS + 1, "commit_tokens": [f"t{i}" for i in range(COMMIT_TOKENS)]}
MARKED = on(FindOne, "confirm", filter={"_id": ID, "processed": dedupe_key("ev-1")}, projection={"_id": 1})


@pytest.mark.parametrize("send", [AutoReconnect("reset"), 0], ids=["reply lost", "driver retry: 0 matched"])
def test_a_commit_outrun_past_its_token_window_with_its_event_marked_is_of_unknown_outcome(send: Any) -> None:
    """The network-fault runs met this: a reply lost in a partition while the other workers
    committed 17 times on the execution. Its token, had it landed, is out of the window, and
    its event is marked processed (by it or by another worker): not a `StoreConflict`
    (which says it was not applied) but an unknown outcome, a connection failure."""
    st, exe = state(), execution()
    with pytest.raises(CommitOutcomeUnknown) as err:
        commit(st, exe, (cas(), send), (READ_BACK, stored(OUTRUN)), (MARKED, {"_id": ID}))
    assert isinstance(err.value, ConnectionFailure) and not isinstance(err.value, StoreConflict)
    assert (err.value.expected, err.value.found) == (3, OUTRUN["version"])
    assert exe.version == 3 and not st.owners


@pytest.mark.parametrize("send", [AutoReconnect("reset"), 0], ids=["reply lost", "driver retry: 0 matched"])
def test_a_commit_outrun_past_its_token_window_with_its_event_unmarked_is_a_conflict(send: Any) -> None:
    """Had it landed, its event would be in the dedupe window (longer than the commits
    since): it did not, a plain conflict."""
    st, exe = state(), execution()
    with pytest.raises(StoreConflict) as err:
        commit(st, exe, (cas(), send), (READ_BACK, stored(OUTRUN)), (MARKED, None))
    assert err.value.found == OUTRUN["version"]


def test_a_commit_outrun_past_its_dedupe_window_too_is_of_unknown_outcome() -> None:
    """With a dedupe window shorter than the commits since, no mark settles it."""
    st, exe = state(dedupe_window=COMMIT_TOKENS), execution()
    with pytest.raises(CommitOutcomeUnknown):
        commit(st, exe, (cas(), 0), (READ_BACK, stored(OUTRUN)))


def test_a_conflict_within_the_token_window_reads_nothing_more() -> None:
    """Moved on by no more commits than the window remembers, and our token absent: it did
    not land; one read back, no mark looked up."""
    st, exe = state(), execution()
    within = {**OUTRUN, "version": 3 + COMMIT_TOKENS}
    with pytest.raises(StoreConflict):
        commit(st, exe, (cas(), AutoReconnect("reset")), (READ_BACK, stored(within)))


def test_retries_exhausted_reraise_the_lost_reply() -> None:
    """1 send and UNKNOWN_OUTCOME_RETRIES re-sends, each reply lost and each read-back
    showing the loaded version: the driver's error goes up, nothing is reported landed."""
    st, exe = state(), execution()
    errors = [AutoReconnect(f"reset {i}") for i in range(flows.UNKNOWN_OUTCOME_RETRIES + 1)]
    same = on(UpdateOne, "executions", filter=lambda f: True)
    steps: list[Step] = []
    for i, error in enumerate(errors):
        steps += [(cas() if i == 0 else same, error), (READ_BACK, {"_id": ID, "version": 3, "commit_tokens": ["t3"]})]
    script = Script(*steps)
    with pytest.raises(AutoReconnect) as err:
        script.run(flows.commit(st, CommitRequest(exe, EMITS)))
    assert err.value is errors[-1]  # the last send's error: the driver's own, not wrapped
    writes = script.seen[::2]
    assert all(w == writes[0] for w in writes)
    assert exe.version == 3 and not st.owners


def test_a_read_back_that_fails_too_reraises_the_lost_reply() -> None:
    st, exe = state(), execution()
    lost = NetworkTimeout("the write's reply")
    reads = [(READ_BACK, AutoReconnect(f"read {i}")) for i in range(flows.UNKNOWN_OUTCOME_RETRIES + 1)]
    with pytest.raises(NetworkTimeout) as err:
        commit(st, exe, (cas(), lost), *reads)
    assert err.value is lost
    assert exe.version == 3


def test_a_read_back_that_fails_then_answers_settles_the_commit() -> None:
    st, exe = state(), execution()
    seqs, _ = commit(
        st,
        exe,
        (cas(), AutoReconnect("reset")),
        (READ_BACK, AutoReconnect("still down")),
        (READ_BACK, AutoReconnect("still down")),
        (READ_BACK, stored({"_id": ID, "version": 4, "commit_tokens": [MINE]})),
    )
    assert_landed(st, exe, seqs, 4, [FIRST_SEQ])


def test_a_read_back_after_a_refused_cas_is_tried_once() -> None:
    """No reply was lost: the read-back is not retried and a connection error goes up."""
    st, exe = state(), execution()
    with pytest.raises(ConnectionFailure):
        commit(st, exe, (cas(), 0), (READ_BACK, AutoReconnect("down")))


# --- the commit: a tombstone found on creation ----------------------------------------------

TOMB = {"at": 1.0, "buried": ["b0", "b1"]}


def test_a_creation_over_a_tombstone_replaces_it_guarded_by_the_exact_tomb() -> None:
    st, exe = state(), execution(version=0)
    replace = on(
        ReplaceOne,
        "executions",
        filter={"_id": ID, "tomb": TOMB, "cc": None, "cseq": None},
        replacement=lambda r: r["_id"] == ID and r["version"] == 1 and r["buried"] == ["b0", "b1"] and "tomb" not in r,
    )
    seqs, script = commit(
        st, exe, (CREATE, DuplicateKeyError("dup", 11000)), (READ_BACK, {"_id": ID, "tomb": TOMB}), (replace, 1)
    )
    assert token_of(script.seen[0]) == the(ReplaceOne, script.seen[2]).replacement["born"]
    assert_landed(st, exe, seqs, 1, [FIRST_SEQ])


def test_a_tombstone_changed_under_the_replace_is_looked_at_again() -> None:
    """The replace missed (the tomb moved on): the document is read again and what it holds
    decides; here a creator of the reused id got there first."""
    st, exe = state(), execution(version=0)
    replace = on(ReplaceOne, "executions", filter={"_id": ID, "tomb": TOMB, "cc": None, "cseq": None})
    with pytest.raises(StoreConflict) as err:
        commit(
            st,
            exe,
            (CREATE, DuplicateKeyError("dup", 11000)),
            (READ_BACK, {"_id": ID, "tomb": TOMB}),
            (replace, 0),
            (READ_BACK, {"_id": ID, "version": 1, "commit_tokens": ["theirs"]}),
        )
    assert (err.value.expected, err.value.found) == (0, 1)


def test_a_lost_creation_found_buried_in_a_tombstone_is_reported_landed() -> None:
    """Our insert landed, then the execution was purged: our `born` token is buried."""
    st, exe = state(), execution(version=0)
    seqs, _ = commit(
        st,
        exe,
        (CREATE, AutoReconnect("reset")),
        (READ_BACK, stored({"_id": ID, "tomb": {"at": 1.0, "buried": ["b0", MINE]}})),
    )
    assert_landed(st, exe, seqs, 1, [FIRST_SEQ])


# --- the commit: a clock behind the execution's seq_hi --------------------------------------


def test_a_clock_behind_seq_hi_mints_above_it_and_sends_a_new_plan() -> None:
    st, exe = state(), execution()
    their_hi = seq_at(NOW_MS + 10, node=9)  # another instance, clock ahead, same millisecond range
    above = seq_at(NOW_MS + 11)  # our node's first seq above theirs
    seqs, script = commit(
        st, exe, (cas(), 0), (READ_BACK, {"_id": ID, "version": 3, "seq_hi": their_hi}), (cas(first_seq=above), 1)
    )
    assert token_of(script.seen[2]) != token_of(script.seen[0])  # a new plan, a new token
    assert_landed(st, exe, seqs, 4, [above])


def test_a_seq_hi_beyond_the_lease_extends_the_lease_first() -> None:
    st, exe = state(), execution()
    their_hi = seq_at(NOW_MS + 2 * LEASE_SPAN_MS, node=9)
    new_hi = extended_hi(NOW_MS + LEASE_SPAN_MS, NOW_MS, NOW_MS + 2 * LEASE_SPAN_MS + 1)
    extend = on(
        UpdateOne, "leases", filter={"_id": lease_id(NODE), "owner": "me"}, update=lambda u: u["$max"] == {"hi": new_hi}
    )
    above = seq_at(NOW_MS + 2 * LEASE_SPAN_MS + 1)
    seqs, _ = commit(
        st,
        exe,
        (cas(), 0),
        (READ_BACK, {"_id": ID, "version": 3, "seq_hi": their_hi}),
        (extend, 1),
        (cas(first_seq=above), 1),
    )
    assert_landed(st, exe, seqs, 4, [above])
    assert st.mint.lease is not None and st.mint.lease.hi == new_hi


def test_a_seq_hi_already_minted_above_is_a_conflict() -> None:
    """Minted above `seq_hi` once and refused again at the same version and bound: the CAS
    fails for another reason, and the commit stops rather than loop."""
    st, exe = state(), execution()
    their_hi = seq_at(NOW_MS + 10, node=9)
    back = (READ_BACK, {"_id": ID, "version": 3, "seq_hi": their_hi})
    with pytest.raises(StoreConflict) as err:
        commit(st, exe, (cas(), 0), back, (cas(first_seq=seq_at(NOW_MS + 11)), 0), back)
    assert err.value.found == 3


# --- the commit: size refusals --------------------------------------------------------------


def test_an_execution_over_budget_is_refused_before_anything_is_sent() -> None:
    st = state()
    budget = data_budget(st.trace_max, st.trace_step_bytes, st.dedupe_window)
    exe = execution(context={"blob": "x" * (budget + 1)})
    with pytest.raises(ExecutionTooLarge) as err:
        commit(st, exe)  # no step: any call fails the test
    assert set(err.value.parts) == {"the execution's JSON", "of which its context"}
    assert err.value.parts["of which its context"] > budget
    assert err.value.size > err.value.limit == budget
    assert err.value.reserved == MAX_DOCUMENT_BYTES - budget


SIZE_REFUSALS = [WriteError("too large", code) for code in (10334, 17419, 17420, 13134)] + [
    DocumentTooLarge("too large")
]


@pytest.mark.parametrize("version", [0, 3], ids=["insert", "update"])
@pytest.mark.parametrize("refusal", SIZE_REFUSALS, ids=["10334", "17419", "17420", "13134", "DocumentTooLarge"])
def test_a_size_refusal_reads_once_what_the_document_holds(version: int, refusal: Exception) -> None:
    st, exe = state(), execution(version=version)
    held = {"_id": ID, "outbox": [{"seq": 1, "target_id": "x", "event": "e" * 100_000}], "trace": []}
    read = on(
        FindOne,
        "executions",
        filter={"_id": ID},
        projection={k: 1 for k in ("outbox", "spawns", "trace", "processed", "timers")},
    )
    with pytest.raises(ExecutionTooLarge) as err:
        commit(st, exe, (CREATE if version == 0 else cas(), refusal), (read, held))
    parts = err.value.parts
    assert set(parts) == {"the execution's JSON", "this commit's new outbox entries and spawns", "pending outbox"}
    assert parts["pending outbox"] > 100_000 and err.value.limit == MAX_DOCUMENT_BYTES
    assert "pending outbox" in str(err.value) and exe.version == version


def test_another_write_error_goes_up_as_it_is() -> None:
    st, exe = state(), execution()
    refusal = WriteError("document failed validation", 121)
    with pytest.raises(WriteError) as err:
        commit(st, exe, (cas(), refusal))
    assert err.value is refusal


# --- the commit: branches that do not keep the rules above (known bugs) ----------------------

REPLACE_TOMB = on(ReplaceOne, "executions", filter={"_id": ID, "tomb": TOMB, "cc": None, "cseq": None})
OVER_A_TOMB: list[Step] = [(CREATE, DuplicateKeyError("dup", 11000)), (READ_BACK, {"_id": ID, "tomb": TOMB})]


def test_a_lost_reply_on_the_tombstone_replace_is_settled_by_the_read_back() -> None:
    st, exe = state(), execution(version=0)
    seqs, _ = commit(
        st,
        exe,
        *OVER_A_TOMB,
        (REPLACE_TOMB, AutoReconnect("reset")),
        (READ_BACK, stored({"_id": ID, "version": 1, "commit_tokens": [MINE], "buried": ["b0", "b1"]})),
    )
    assert_landed(st, exe, seqs, 1, [FIRST_SEQ])


def test_a_size_refusal_on_the_tombstone_replace_is_execution_too_large() -> None:
    st, exe = state(), execution(version=0)
    read = on(FindOne, "executions", filter={"_id": ID})
    with pytest.raises(ExecutionTooLarge):
        commit(st, exe, *OVER_A_TOMB, (REPLACE_TOMB, WriteError("too large", 10334)), (read, {"_id": ID}))


def test_a_read_back_that_times_out_is_tried_again() -> None:
    st, exe = state(), execution()
    seqs, _ = commit(
        st,
        exe,
        (cas(), ExecutionTimeout("write timed out", 50)),
        (READ_BACK, ExecutionTimeout("read timed out", 50)),
        (READ_BACK, stored({"_id": ID, "version": 4, "commit_tokens": [MINE]})),
    )
    assert_landed(st, exe, seqs, 4, [FIRST_SEQ])


# --- the seq mint and its leases ------------------------------------------------------------

HAREL_COUNTERS = on(Find, "leases", filter={"_id": {"$in": list(HAREL_SEQ_COUNTERS)}}, projection={"n": 1})


def node_counter(n: Optional[int]) -> Step:
    return (
        on(Increment, "leases", id=NODE_COUNTER_ID, field="n"),
        None if n is None else {"_id": NODE_COUNTER_ID, "n": n},
    )


def probe(first: int) -> Expect:
    """The read of the lease documents of the 64 nodes from `first` on."""
    return on(Find, "leases", filter={"_id": {"$in": [lease_id((first + i) % NODES) for i in range(64)]}})


def claim_new(node: int) -> Expect:
    return on(
        InsertOne,
        "leases",
        document=lambda d: d["_id"] == lease_id(node) and d["node"] == node and d["expires"] == WALL + LEASE_TTL_S,
    )


def claim_over(node: int, owner: str, hi: int) -> Expect:
    return on(
        UpdateOne,
        "leases",
        filter={"_id": lease_id(node), "owner": owner, "hi": hi},
        update=lambda u: u["$set"]["node"] == node,
    )


def lease_doc(node: int, expires: float, owner: str = "other", hi: int = NOW_MS + 5_000) -> dict[str, Any]:
    return {"_id": lease_id(node), "node": node, "owner": owner, "hi": hi, "expires": expires}


def owner_written(call: Call) -> str:
    if isinstance(call, InsertOne):
        return str(call.document["owner"])
    if isinstance(call, UpdateOne) and isinstance(call.update, dict):
        return str(call.update["$set"]["owner"])
    raise AssertionError(f"not a lease claim: {_short(call)}")


OURS_NOW = Computed(lambda call, seen: {"_id": lease_id(7), "owner": owner_written(seen[-2])})
DUP = DuplicateKeyError("dup", 11000)

# how the first free node is claimed; the node counter says 8, so the probe starts at node 7
CLAIMS = [
    ("a node never leased: insert", [], [(claim_new(7), None)], 7),
    (
        "an expired lease: taken over above its hi",
        [lease_doc(7, WALL - 1)],
        [(claim_over(7, "other", NOW_MS + 5_000), 1)],
        7,
    ),
    ("a live lease: skipped", [lease_doc(7, WALL + 1)], [(claim_new(8), None)], 8),
    (
        "insert refused (DuplicateKey), another's: next node",
        [],
        [
            (claim_new(7), DUP),
            (on(FindOne, "leases", filter={"_id": lease_id(7)}), lease_doc(7, WALL + 9)),
            (claim_new(8), None),
        ],
        8,
    ),
    (
        "insert refused by our own first attempt (the driver's retry): we own it",
        [],
        [(claim_new(7), DUP), (on(FindOne, "leases", filter={"_id": lease_id(7)}), OURS_NOW)],
        7,
    ),
    (
        "takeover raced (matched 0), another's: next node",
        [lease_doc(7, WALL - 1)],
        [
            (claim_over(7, "other", NOW_MS + 5_000), 0),
            (on(FindOne, "leases", filter={"_id": lease_id(7)}), lease_doc(7, WALL + 9)),
            (claim_new(8), None),
        ],
        8,
    ),
    (
        "takeover matched 0 after our own first attempt (the driver's retry): we own it",
        [lease_doc(7, WALL - 1)],
        [(claim_over(7, "other", NOW_MS + 5_000), 0), (on(FindOne, "leases", filter={"_id": lease_id(7)}), OURS_NOW)],
        7,
    ),
    (
        "claim reply lost, we own it",
        [],
        [(claim_new(7), AutoReconnect("reset")), (on(FindOne, "leases", filter={"_id": lease_id(7)}), OURS_NOW)],
        7,
    ),
    (
        "claim reply lost, another owns it: next node",
        [],
        [
            (claim_new(7), NetworkTimeout("t")),
            (on(FindOne, "leases", filter={"_id": lease_id(7)}), lease_doc(7, WALL + 9)),
            (claim_new(8), None),
        ],
        8,
    ),
    (
        "claim reply lost, nothing there: next node",
        [],
        [
            (claim_new(7), AutoReconnect("reset")),
            (on(FindOne, "leases", filter={"_id": lease_id(7)}), None),
            (claim_new(8), None),
        ],
        8,
    ),
]


@pytest.mark.parametrize("docs, claims, node", [c[1:] for c in CLAIMS], ids=[c[0] for c in CLAIMS])
def test_the_first_mint_takes_a_lease(docs: list[dict[str, Any]], claims: list[Step], node: int) -> None:
    st = state(lease=False)
    seqs = run(flows.mint_seqs(st, 2), node_counter(8), (HAREL_COUNTERS, []), (probe(7), docs), *claims)
    lease = st.mint.lease
    assert lease is not None and lease.node == node and lease.expires == WALL + LEASE_TTL_S
    assert [node_of(s) for s in seqs] == [node, node] and seqs[0] < seqs[1]
    assert lease.lo <= seqs[0] >> MS_SHIFT < lease.hi
    taken_over = [d for d in docs if d["_id"] == lease_id(node)]
    if taken_over:  # Rule 2: above every millisecond the earlier holder was allowed
        assert lease.lo >= taken_over[0]["hi"]


def test_a_lease_starts_above_harel_s_own_counters() -> None:
    st = state(lease=False)
    harel_seq = seq_at(NOW_MS + 500, node=0, n=7)
    seqs = run(
        flows.mint_seqs(st, 1),
        node_counter(8),
        (HAREL_COUNTERS, [{"_id": "outbox", "n": harel_seq}, {"_id": "spawn", "n": 12}]),
        (probe(7), []),
        (claim_new(7), None),
    )
    assert seqs[0] > harel_seq and st.mint.lease is not None and st.mint.lease.lo > harel_seq >> MS_SHIFT


def test_without_a_node_counter_the_probe_starts_anywhere_and_wraps() -> None:
    st = state(lease=False)

    def consecutive(f: dict[str, Any]) -> bool:
        nodes = [int(i.rsplit(":", 1)[1]) for i in f["_id"]["$in"]]
        return len(nodes) == 64 and all((b - a) % NODES == 1 for a, b in zip(nodes, nodes[1:]))

    first_free = Computed(lambda call, seen: [])
    script = Script(
        node_counter(None),
        (HAREL_COUNTERS, []),
        (on(Find, "leases", filter=consecutive), first_free),
        (on(InsertOne, "leases"), None),
    )
    seqs = script.run(flows.mint_seqs(st, 1))
    probed = the(Find, script.seen[2]).filter["_id"]["$in"]
    assert the(InsertOne, script.seen[3]).document["_id"] == probed[0]
    assert st.mint.lease is not None and node_of(seqs[0]) == st.mint.lease.node


def test_all_nodes_held_by_live_instances_is_an_error() -> None:
    st = state(lease=False)
    all_live = Computed(
        lambda call, seen: [lease_doc(0, WALL + 60) | {"_id": i} for i in the(Find, call).filter["_id"]["$in"]]
    )
    probes = [(probe(first), all_live) for first in range(0, NODES, 64)]
    with pytest.raises(RuntimeError, match=f"all {NODES} seq nodes"):
        run(flows.mint_seqs(st, 1), node_counter(1), (HAREL_COUNTERS, []), *probes)
    assert st.mint.lease is None


def due_lease_state() -> StoreState:
    """A lease whose hi is within the renewal margin of the clock."""
    st = state(lease=False)
    st.mint.install(Lease(NODE, NOW_MS - 50_000, NOW_MS + 20_000, "me", WALL + 10))
    return st


def test_a_lease_due_for_extension_is_raised_under_an_owner_guard() -> None:
    st = due_lease_state()
    new_hi = extended_hi(NOW_MS + 20_000, NOW_MS, NOW_MS + 1)
    extend = on(
        UpdateOne,
        "leases",
        filter={"_id": lease_id(NODE), "owner": "me"},
        update={"$max": {"hi": new_hi}, "$set": {"expires": WALL + LEASE_TTL_S}},
    )
    seqs = run(flows.mint_seqs(st, 1), (extend, 1))
    assert seqs == [seq_at(NOW_MS)]
    assert st.mint.lease == Lease(NODE, NOW_MS - 50_000, new_hi, "me", WALL + LEASE_TTL_S)


def test_an_extension_refused_takes_a_new_lease() -> None:
    """The node was taken over while this instance was away (Rule 5): another node."""
    st = due_lease_state()
    seqs = run(
        flows.mint_seqs(st, 1),
        (on(UpdateOne, "leases", filter={"_id": lease_id(NODE), "owner": "me"}), 0),
        node_counter(8),
        (HAREL_COUNTERS, []),
        (probe(7), []),
        (claim_new(7), None),
    )
    assert node_of(seqs[0]) == 7 and st.mint.lease is not None and st.mint.lease.owner != "me"


def test_minting_nothing_makes_no_call() -> None:
    assert run(flows.mint_seqs(state(lease=False), 0)) == []


def test_release_gives_the_node_back_under_an_owner_guard() -> None:
    st = state()
    run(
        flows.release_lease(st),
        (on(UpdateOne, "leases", filter={"_id": lease_id(NODE), "owner": "me"}, update={"$set": {"expires": 0.0}}), 1),
    )
    assert st.mint.lease is None
    run(flows.release_lease(st))  # nothing held: nothing to give back


# --- set-up ---------------------------------------------------------------------------------

MARKER = on(FindOne, "counters", filter={"_id": SCHEMA_MARKER_ID})
ANY_EXECUTION = on(FindOne, "executions", filter={}, projection={"_id": 1})
WRITE_MARKER = on(
    UpdateOne,
    "counters",
    filter={"_id": SCHEMA_MARKER_ID},
    update={"$setOnInsert": {"n": SCHEMA_VERSION, "parts": DEFAULT_PARTITIONS}},
    upsert=True,
)

THIS_LAYOUT = {"_id": SCHEMA_MARKER_ID, "n": SCHEMA_VERSION}

# the marker read's reply, then the steps after the index build (when create_schema)
SETUPS = [
    (
        "a fresh database gets its marker, and the count of partitions it records",
        True,
        None,
        [
            (ANY_EXECUTION, None),
            (WRITE_MARKER, None),
            (MARKER, {**THIS_LAYOUT, "parts": DEFAULT_PARTITIONS}),
            # and its counters, built counting nothing (core.counting's last paragraph)
            *[(on(UpdateOne, "counts", filter={"_id": p}, upsert=True), None) for p in range(DEFAULT_PARTITIONS)],
        ],
        False,
    ),
    ("harel's layout: compat, no marker", True, None, [(ANY_EXECUTION, {"_id": "old"})], True),
    ("this layout: nothing more to do", True, THIS_LAYOUT, [], False),
    ("create_schema=False: no indexes, no marker", False, None, [(ANY_EXECUTION, None)], False),
    ("create_schema=False over harel's layout", False, None, [(ANY_EXECUTION, {"_id": "old"})], True),
]


@pytest.mark.parametrize("create, marker, steps, compat", [s[1:] for s in SETUPS], ids=[s[0] for s in SETUPS])
def test_setup(
    create: bool, marker: Optional[dict[str, Any]], steps: list[Step], compat: bool, caplog: pytest.LogCaptureFixture
) -> None:
    st = state(lease=False, create_schema=create)
    indexes = [(on(CreateIndexes, "executions", indexes=st.indexes), None)] if create else []
    with caplog.at_level(logging.WARNING, logger="harel_beanie"):
        run(flows.setup(st), (MARKER, marker), *indexes, *steps)
    assert st.ready and st.compat == compat
    assert ("harel's MongoStore layout" in caplog.text) == compat
    assert st.mint.lease is None  # the lease waits for the first mint
    assert st.scope.parts == DEFAULT_PARTITIONS and not st.unpartitioned


@pytest.mark.parametrize(
    "marker, parts, unpartitioned",
    [
        ({"n": SCHEMA_VERSION, "parts": 4}, 4, False),  # the recorded count decides, not the default
        ({"n": 2}, DEFAULT_PARTITIONS, True),  # the layout `migrate up` brings up live (partitions)
    ],
)
def test_setup_takes_the_partitions_the_marker_records(
    marker: dict[str, Any], parts: int, unpartitioned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    st = state(lease=False, create_schema=True)
    run(flows.setup(st), (MARKER, {"_id": SCHEMA_MARKER_ID, **marker}), (on(CreateIndexes, "executions"), None))
    assert (st.scope.parts, st.unpartitioned) == (parts, unpartitioned)


@pytest.mark.parametrize("parts", [0, -1, True, "16", 10**6])
def test_setup_refuses_a_marker_with_a_bad_count_of_partitions(parts: Any) -> None:
    st = state(lease=False, create_schema=True)
    with pytest.raises(SchemaMismatch):
        run(flows.setup(st), (MARKER, {"_id": SCHEMA_MARKER_ID, "n": SCHEMA_VERSION, "parts": parts}))


@pytest.mark.parametrize(
    "marker, found",
    [({"n": SCHEMA_VERSION + 1}, SCHEMA_VERSION + 1), ({"n": 0}, 0), ({}, 0)],
    ids=["newer", "zero", "no n"],
)
def test_setup_refuses_another_layout(marker: dict[str, Any], found: int) -> None:
    """Before creating any index: another layout's indexes are its migration's business."""
    st = state(lease=False)
    assert st.create_schema
    with pytest.raises(SchemaMismatch) as err:
        run(flows.setup(st), (MARKER, {"_id": SCHEMA_MARKER_ID, **marker}))
    assert (err.value.found, err.value.expected) == (found, SCHEMA_VERSION)
    assert not st.ready


@pytest.mark.parametrize(
    "steps",
    [
        [(MARKER, AutoReconnect("down"))],
        [(MARKER, None), (on(CreateIndexes, "executions"), AutoReconnect("down"))],
    ],
    ids=["at the marker read", "at the index build"],
)
def test_setup_interrupted_by_the_driver_is_not_ready(steps: list[Step]) -> None:
    st = state(lease=False)
    with pytest.raises(AutoReconnect):
        run(flows.setup(st), *steps)
    assert not st.ready


# --- due timers and their repairs -----------------------------------------------------------

DUE = {"next_fire": {**ANY_TIME, "$lte": 100.0}}  # ANY_TIME: the partial timer index's filter
SWEEP = on(Find, "executions", filter=DUE, projection={"_id": 1, "version": 1, "timers": 1, "next_fire": 1})
COMPAT_SWEEP = on(Find, "executions", filter={"$or": [DUE, {"timers": {"$nin": [{}, None]}}]})


def timer_doc(id: str, timers: dict[str, float], **more: Any) -> dict[str, Any]:
    return {"_id": id, "version": 2, "timers": timers, **more}


def repair(id: str, bound: Optional[float], update: dict[str, Any]) -> Step:
    return (on(UpdateOne, "executions", filter={"_id": id, "version": 2, "next_fire": bound}, update=update), 1)


TIMER_SWEEPS = [
    ("nothing due", False, [], [], []),
    (
        "due timers, by fire time, bounds left alone",
        False,
        [timer_doc("a", {"t1": 90.0, "t2": 500.0}, next_fire=90.0), timer_doc("b", {"t0": 50.0}, next_fire=50.0)],
        [],
        [("b", "t0", 50.0), ("a", "t1", 90.0)],
    ),
    (
        "a stale bound (its timer was cancelled) is raised",
        False,
        [timer_doc("a", {"t2": 500.0}, next_fire=80.0)],
        [repair("a", 80.0, {"$set": {"cdirty": True, "next_fire": 500.0}})],
        [],
    ),
    (
        "a bound with no timer left is dropped",
        False,
        [timer_doc("a", {}, next_fire=80.0)],
        [repair("a", 80.0, {"$set": {"cdirty": True}, "$unset": {"next_fire": ""}})],
        [],
    ),
    (
        "compat: a missing bound is set",
        True,
        [timer_doc("h", {"t2": 500.0})],
        [repair("h", None, {"$set": {"cdirty": True, "next_fire": 500.0}})],
        [],
    ),
    (
        "compat: a missing bound with a timer due is left to the commit",
        True,
        [timer_doc("h", {"t1": 99.0})],
        [],
        [("h", "t1", 99.0)],
    ),
]


@pytest.mark.parametrize("compat, docs, repairs, due", [t[1:] for t in TIMER_SWEEPS], ids=[t[0] for t in TIMER_SWEEPS])
def test_due_timers(
    compat: bool, docs: list[dict[str, Any]], repairs: list[Step], due: list[tuple[str, str, float]]
) -> None:
    st = state(lease=False)
    st.compat = compat
    assert run(flows.due_timers(st, 100.0), (COMPAT_SWEEP if compat else SWEEP, docs), *repairs) == due


# --- purge ----------------------------------------------------------------------------------

PURGE_READ = on(
    FindOne,
    "executions",
    filter={"_id": ID},
    projection={"version": 1, "born": 1, "buried": 1, "tomb": 1, "cc": 1, "cseq": 1},
)
RECHECK = on(FindOne, "executions", filter={"_id": ID}, projection={"tomb": 1, "version": 1})
HOLDERS = on(Find, "executions", filter=PENDING, projection={"outbox.target_id": 1})
COMPAT_HOLDERS = on(Find, "executions", filter={"outbox.seq": ANY_SEQ}, projection={"outbox.target_id": 1})
HOLDER_DOCS = [
    {"_id": "h1", "outbox": [{"target_id": "elsewhere"}, {"target_id": ID}]},
    {"_id": "h2", "outbox": [{"target_id": "elsewhere"}]},
    {"_id": "h3", "outbox": [{"target_id": ID}]},
]
PULL_FILTER = {"_id": {"$in": ["h1", "h3"]}, "outbox.target_id": ID}
# the entries addressed to ID go, and `pending` is cleared in the same write if none is left
PULL_PIPELINE = [
    {
        "$set": {
            "outbox": {
                "$filter": {
                    "input": {"$ifNull": ["$outbox", []]},
                    "cond": {"$or": [{"$ne": ["$$this.target_id", {"$literal": ID}]}]},
                }
            }
        }
    },
    {
        "$set": {
            "pending": {
                "$cond": [
                    {
                        "$or": [
                            {"$gt": [{"$size": {"$ifNull": ["$outbox", []]}}, 0]},
                            {"$gt": [{"$size": {"$ifNull": ["$spawns", []]}}, 0]},
                        ]
                    },
                    True,
                    "$$REMOVE",
                ]
            },
            "cdirty": True,  # marked for the fold, which decides its `quiet` (core.stuck)
        }
    },
]
PULL = (on(UpdateMany, "executions", filter=PULL_FILTER, update=PULL_PIPELINE), 2)
CLEANUP = [(HOLDERS, HOLDER_DOCS), PULL]
COMPAT_CLEANUP = [(COMPAT_HOLDERS, HOLDER_DOCS), PULL]  # no `pending` flag: found by the seq


def bury(born: Optional[str], buried: list[str]) -> Step:
    def tomb(replacement: dict[str, Any]) -> bool:
        # `by` is the purge's own random token (see flows.purge)
        by = replacement.get("tomb", {}).get("by")
        # the tombstone is counted anew (core.counting): marked dirty
        want = {"_id": ID, "tomb": {"at": WALL, "buried": buried, "by": by}, "part": part_of(ID, DEFAULT_PARTITIONS)}
        return replacement == {**want, "cdirty": True} and isinstance(by, str) and len(by) == 16

    guard = {"_id": ID, "version": 3, "born": born, "cc": None, "cseq": None}
    return (on(ReplaceOne, "executions", filter=guard, replacement=tomb), 1)


# the tombstone this purge's own replace wrote (the call before the recheck)
OWN_TOMB = Computed(lambda call, seen: {"_id": ID, "tomb": seen[-2].replacement["tomb"]})


def missed(step: Step) -> Step:
    return (step[0], 0)


OLD = [f"b{i}" for i in range(64)]
PURGES = [
    (
        "at the expected version",
        False,
        {"_id": ID, "version": 3, "born": "b1", "buried": ["b0"]},
        [bury("b1", ["b0", "b1"]), *CLEANUP],
        True,
    ),
    (
        "a long buried list keeps its newest 64",
        False,
        {"_id": ID, "version": 3, "born": "new", "buried": OLD},
        [bury("new", OLD[1:] + ["new"]), *CLEANUP],
        True,
    ),
    ("harel's document: no born", False, {"_id": ID, "version": 3}, [bury(None, []), *CLEANUP], True),
    ("moved on: touch nothing", False, {"_id": ID, "version": 4, "born": "b1"}, [], False),
    (
        "already a tombstone: cleanup still runs",
        False,
        {"_id": ID, "tomb": {"at": 1.0, "buried": ["b1"]}},
        CLEANUP,
        False,
    ),
    ("missing: cleanup still runs", False, None, CLEANUP, False),
    ("no holder: no pull", False, None, [(HOLDERS, HOLDER_DOCS[1:2])], False),
    (
        "replace missed, a late earlier purge buried it: finish cleanup",
        False,
        {"_id": ID, "version": 3, "born": "b1"},
        [missed(bury("b1", ["b1"])), (RECHECK, {"_id": ID, "tomb": {"at": 2.0, "buried": ["b1"]}}), *CLEANUP],
        False,
    ),
    (
        "replace matched nothing after its own first attempt landed (the driver's retry): purged",
        False,
        {"_id": ID, "version": 3, "born": "b1"},
        [missed(bury("b1", ["b1"])), (RECHECK, OWN_TOMB), *CLEANUP],
        True,
    ),
    (
        "replace missed, gone meanwhile: finish cleanup",
        False,
        {"_id": ID, "version": 3, "born": "b1"},
        [missed(bury("b1", ["b1"])), (RECHECK, None), *CLEANUP],
        False,
    ),
    (
        "replace missed, moved on meanwhile: touch nothing",
        False,
        {"_id": ID, "version": 3, "born": "b1"},
        [missed(bury("b1", ["b1"])), (RECHECK, {"_id": ID})],
        False,
    ),
    (
        "compat: harel's trace counter goes too",
        True,
        {"_id": ID, "version": 3},
        [bury(None, []), *COMPAT_CLEANUP, (on(DeleteOne, "counters", filter={"_id": "trace:" + ID}), 1)],
        True,
    ),
]


@pytest.mark.parametrize("compat, doc, steps, purged", [p[1:] for p in PURGES], ids=[p[0] for p in PURGES])
def test_purge(compat: bool, doc: Optional[dict[str, Any]], steps: list[Step], purged: bool) -> None:
    st = state(lease=False)
    st.compat = compat
    assert run(flows.purge(st, ID, 3), (PURGE_READ, doc), *steps) is purged


def test_purge_in_memory_pulls_without_the_pipeline() -> None:
    """mongomock evaluates the pipeline wrongly: a plain `$pull` (the flag may stay set)."""
    st = state(lease=False)
    st.in_memory = True
    pull = on(
        UpdateMany,
        "executions",
        filter=PULL_FILTER,
        update={"$pull": {"outbox": {"target_id": ID}}, "$set": {"cdirty": True}},
    )
    assert run(flows.purge(st, ID, 3), (PURGE_READ, None), (HOLDERS, HOLDER_DOCS), (pull, 2)) is False


# --- reads that decide a drop ---------------------------------------------------------------

SNAPSHOT = execution(version=4).model_dump_json()
LOAD_FILTER = {"_id": ID}
#: a load reads the snapshot and what the execution waits on (the next commit's hint)
LOAD = {"data": 1, "pending": 1, "next_fire": 1, "timers": 1}


def load_read(keys: list[str]) -> Expect:
    return on(
        FindOne, "executions", filter=LOAD_FILTER, projection={**LOAD, "processed": {"$elemMatch": {"$in": keys}}}
    )


def confirm_read(keys: list[str]) -> Expect:
    return on(FindOne, "confirm", filter=LOAD_FILTER, projection={"_id": 1, "processed": {"$elemMatch": {"$in": keys}}})


LONG_ID = "e" * 200
LOADS = [
    ("no execution", "ev-1", [(load_read(["ev-1"]), None)], False, False),
    (
        "a tombstone is no execution",
        "ev-1",
        [(load_read(["ev-1"]), {"_id": ID, "tomb": {"at": 1.0, "buried": []}})],
        False,
        False,
    ),
    ("not processed", "ev-1", [(load_read(["ev-1"]), {"_id": ID, "data": SNAPSHOT})], True, False),
    (
        "processed, confirmed by a confirm read",
        "ev-1",
        [
            (load_read(["ev-1"]), {"_id": ID, "data": SNAPSHOT, "processed": ["ev-1"]}),
            (confirm_read(["ev-1"]), {"_id": ID, "processed": ["ev-1"]}),
        ],
        True,
        True,
    ),
    (
        "processed, not confirmed (the mark may still roll back)",
        "ev-1",
        [
            (load_read(["ev-1"]), {"_id": ID, "data": SNAPSHOT, "processed": ["ev-1"]}),
            (confirm_read(["ev-1"]), {"_id": ID}),
        ],
        True,
        False,
    ),
    (
        "a long id is looked up by its digest and as itself",
        LONG_ID,
        [
            (
                load_read([dedupe_key(LONG_ID), LONG_ID]),
                {"_id": ID, "data": SNAPSHOT, "processed": [dedupe_key(LONG_ID)]},
            ),
            (confirm_read([dedupe_key(LONG_ID), LONG_ID]), {"_id": ID, "processed": [dedupe_key(LONG_ID)]}),
        ],
        True,
        True,
    ),
]


@pytest.mark.parametrize("event_id, steps, exists, seen", [r[1:] for r in LOADS], ids=[r[0] for r in LOADS])
def test_load_for_event(event_id: str, steps: list[Step], exists: bool, seen: bool) -> None:
    exe, processed = run(flows.load_for_event(state(lease=False), ID, event_id), *steps)
    assert (exe is not None, processed) == (exists, seen)
    if exe is not None:
        assert exe.id == ID and exe.version == 4


IN_MEMORY_READ = on(FindOne, "executions", filter=LOAD_FILTER, projection={**LOAD, "processed": 1})
IN_MEMORY_LOADS = [
    ("processed", {"_id": ID, "data": SNAPSHOT, "processed": ["x", "ev-1"]}, True, True),
    ("not processed", {"_id": ID, "data": SNAPSHOT, "processed": ["x"]}, True, False),
    ("no execution", None, False, False),
    ("a tombstone", {"_id": ID, "tomb": {"at": 1.0, "buried": []}}, False, False),
]


@pytest.mark.parametrize("doc, exists, seen", [r[1:] for r in IN_MEMORY_LOADS], ids=[r[0] for r in IN_MEMORY_LOADS])
def test_load_for_event_in_memory_reads_the_whole_window_once(
    doc: Optional[dict[str, Any]], exists: bool, seen: bool
) -> None:
    st = state(lease=False)
    st.in_memory = True
    exe, processed = run(flows.load_for_event(st, ID, "ev-1"), (IN_MEMORY_READ, doc))
    assert (exe is not None, processed) == (exists, seen)


@pytest.mark.parametrize(
    "reply, seen",
    [
        ({"_id": ID, "processed": ["ev-1"]}, True),
        ({"_id": ID}, False),
        ({"_id": ID, "processed": []}, False),
        (None, False),
    ],
)
def test_is_processed_is_a_confirm_read(reply: Optional[dict[str, Any]], seen: bool) -> None:
    assert run(flows.is_processed(state(lease=False), ID, "ev-1"), (confirm_read(["ev-1"]), reply)) is seen


@pytest.mark.parametrize("reply, seen", [({"_id": ID}, True), (None, False)])
def test_is_processed_in_memory_filters_on_the_window(reply: Optional[dict[str, Any]], seen: bool) -> None:
    st = state(lease=False)
    st.in_memory = True
    query = on(FindOne, "executions", filter={"_id": ID, "processed": {"$in": ["ev-1"]}}, projection={"_id": 1})
    assert run(flows.is_processed(st, ID, "ev-1"), (query, reply)) is seen


# --- the executor itself ----------------------------------------------------------------------


def test_the_script_names_an_unexpected_call() -> None:
    with pytest.raises(AssertionError, match=r"call #1: expected FindOne\('confirm', filter=.*wrong filter"):
        run(flows.is_processed(state(lease=False), ID, "ev-1"), (on(FindOne, "confirm", filter={"_id": "other"}), None))
    with pytest.raises(AssertionError, match="call #1 was not expected"):
        run(flows.is_processed(state(lease=False), ID, "ev-1"))
    with pytest.raises(AssertionError, match="1 steps unused"):
        run(flows.mint_seqs(state(lease=False), 0), (MARKER, None))
