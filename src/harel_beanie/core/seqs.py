"""Outbox and spawn seqs, unique across the database forever, without a counter per commit.

harel acks an outbox entry or a spawn by its `seq` alone, so two entries that ever share a
seq can lose an event: the ack of one pulls the other. harel's MongoStore gets uniqueness
from a global counter document that every commit with an emit must `$inc` first (a round
trip per commit, on one document every worker contends on). Here each store instance mints
seqs itself, in the Snowflake layout

    milliseconds since 2024-01-01 (41 bits) | node (10 bits) | n within the ms (12 bits)

(a positive int64, good until 2093), but the uniqueness rests on *leases*, not on clocks or
on luck. The argument, rule by rule (each is tested in tests/reliability/test_reliability_seqs.py):

Rule 1: a seq is minted only inside a lease. A lease is one node number and a range of
    milliseconds [lo, hi); it is recorded in that node's lease document (`lease_id(node)` in
    the counters collection) as `{owner, hi, expires}`. The mint never hands out a seq whose
    millisecond lies outside its lease, whatever its clock says.
Rule 2: the leases of one node never overlap. A lease is taken by a write conditional on
    the `owner` and `hi` the taker read (or by the insert of a node's first document, which
    the `_id` makes unique), and starts at or above that `hi`; it grows only by a write
    conditional on its owner still holding the node, which raises the recorded `hi` first
    and only then lets the mint use the new milliseconds. So every later lease of the node
    starts above every millisecond an earlier holder was ever allowed to use.
Rule 3: within a lease the mint is strictly increasing (one lock, the last seq kept), so
    one instance never repeats a seq. Seqs of different leases differ in node (Rule 1) or
    in millisecond (Rule 2). Hence no seq is ever minted twice, by any number of instances,
    started and stopped any number of times, however many are alive at once.
Rule 4: clocks only choose where inside its lease a seq falls. A clock behind the lease
    (stepped back, skewed, before 2024) is raised to `lo`; a frozen clock is carried past
    by `n` and then by the millisecond; a clock ahead of `hi` makes the mint extend the
    lease first (Rule 2). No clause above mentions a clock.
Rule 5: expiry is for reusing node numbers, never for safety. A lease whose holder stopped
    renewing it (`expires` passed) may be taken over; the new holder starts at the recorded
    `hi`, above anything the old holder may still mint from its own range if it is merely
    paused or cut off: it keeps minting unique seqs there and learns it lost the node at its
    next extension, when it takes another lease.
Rule 6: seqs stay above harel's own counters. A lease starts above the values harel's
    MongoStore `outbox` and `spawn` counters hold when it is taken (in a database migrated
    from harel's store those counters issued the pending entries' seqs).
Rule 7: lease writes are acknowledged by a majority and the journal and their reads are
    majority reads, whatever the store's own concerns, so a failover can't roll back a
    lease another instance has already built on.

Each execution's seqs must also increase (harel delivers its pending entries oldest first).
Clocks of different machines disagree, so the commit carries the execution's highest seq
(`seq_hi`) in its CAS filter; a writer behind it is told so by the server and mints again
above it (`take(..., above=)`), extending its lease if need be (see
`harel_beanie.core.flows.leases`).

A lease costs a round trip when an instance first mints and about once a minute while it
keeps minting (`LEASE_SPAN_MS`); a store that never mints (a `status` command, a dashboard)
never takes one.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

EPOCH_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
NODE_BITS = 10
SEQ_BITS = 12
NODES = 1 << NODE_BITS
MS_SHIFT = NODE_BITS + SEQ_BITS
MAX_MS = (1 << (63 - MS_SHIFT)) - 1  # the last millisecond whose seqs fit an int64
_SEQ_MASK = (1 << SEQ_BITS) - 1

#: How far past the clock a lease reaches when it is taken or extended.
LEASE_SPAN_MS = 60_000
#: How long (wall seconds) a lease stays the holder's without an extension; then another
#: instance may take the node over (Rule 5).
LEASE_TTL_S = 300.0
#: An active holder extends its lease once this much of its span is used, so a live
#: instance rarely finds itself at `hi` and its lease never expires while it mints.
_RENEW_MARGIN_MS = LEASE_SPAN_MS // 2

#: harel's own MongoStore counters (in the counters collection) whose values seqs stay above.
HAREL_SEQ_COUNTERS = ("outbox", "spawn")


def lease_id(node: int) -> str:
    """The counters-collection `_id` of one node's lease document."""
    return f"harel_beanie:node:{node:04d}"


class SeqSpaceExhausted(RuntimeError):
    """The clock or the lease has reached the last millisecond an int64 seq can carry."""


@dataclass(frozen=True)
class Lease:
    """One node's range of milliseconds [lo, hi), held by `owner` until `expires`."""

    node: int
    lo: int
    hi: int
    owner: str
    expires: float


def new_range(recorded_hi: int, clock_ms: int, floor_ms: int = 0) -> tuple[int, int]:
    """The [lo, hi) of a lease taken over a node whose lease document records `recorded_hi`
    (0 for a node never leased): at or above it (Rule 2), and above `floor_ms` (Rule 6)."""
    lo = max(recorded_hi, clock_ms, floor_ms + 1, 1)
    return lo, extended_hi(lo, clock_ms, lo)


def extended_hi(hi: int, clock_ms: int, want_ms: int) -> int:
    """The `hi` a lease is raised to so it reaches `want_ms` and a span past the clock."""
    new = max(hi, clock_ms, want_ms + 1) + LEASE_SPAN_MS
    if want_ms >= MAX_MS:
        raise SeqSpaceExhausted(f"no seq fits an int64 at millisecond {want_ms} of the seq epoch")
    return min(new, MAX_MS + 1)


def ms_floor_above(value: int) -> int:
    """The millisecond whose every seq exceeds `value` (a counter harel's store handed out)."""
    return (value >> MS_SHIFT) + 1 if value > 0 else 0


class SeqMint:
    """Hands out unique, time-ordered seqs for one store instance (thread-safe).

    It holds at most one lease; `take` answers None when it has none, when the seqs asked
    for do not fit in it, or when it is due for extension; the caller (a flow, which can do
    I/O) then takes or extends a lease and asks again."""

    def __init__(self, clock_ms: Optional[Callable[[], int]] = None) -> None:
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000 - EPOCH_MS)
        self.lease: Optional[Lease] = None
        self._last = 0  # the last seq handed out under the current lease
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        """The clock in milliseconds of the seq epoch (negative before 2024)."""
        return self._clock_ms()

    def install(self, lease: Lease) -> None:
        """Mint from `lease` from now on (a new node, or the same node extended)."""
        with self._lock:
            if self.lease is None or lease.node != self.lease.node or lease.owner != self.lease.owner:
                self._last = 0
            elif lease.hi < self.lease.hi:
                return  # an extension that raced a larger one: keep the larger
            self.lease = lease

    def drop(self, lease: Lease) -> None:
        """Forget `lease` (its node was taken over): the next `take` asks for a new one."""
        with self._lock:
            if self.lease == lease:
                self.lease = None

    def take(self, count: int, above: int = 0) -> Optional[list[int]]:
        """`count` fresh seqs, increasing, each greater than `above` and every earlier one;
        None if the current lease (if any) can't hold them or is due for extension."""
        with self._lock:
            lease = self.lease
            if lease is None:
                return None
            now = self._clock_ms()
            if now + _RENEW_MARGIN_MS >= lease.hi:
                return None  # extend before the clock reaches `hi` (and before expiry)
            floor = max(self._last, above)
            out = []
            for _ in range(count):
                seq = max(now, lease.lo) << MS_SHIFT | lease.node << SEQ_BITS
                if seq <= floor:
                    seq = _next_slot(floor, lease.node)
                if seq >> MS_SHIFT >= lease.hi:
                    return None  # Rule 1: not outside the lease, whatever the clock says
                out.append(seq)
                floor = seq
            self._last = floor
            return out

    def wanted_ms(self, count: int, above: int = 0) -> int:
        """The millisecond a lease must reach (exclusive of `hi`) for `take(count, above)`."""
        floor = max(self._last, above) >> MS_SHIFT
        # each millisecond holds 4,096 seqs of one node: `count` may spill into later ones
        return max(floor, self._clock_ms()) + 1 + count // (_SEQ_MASK + 1)


def _next_slot(floor: int, node: int) -> int:
    """The smallest seq of `node` above `floor`."""
    ms = floor >> MS_SHIFT
    same_ms = ms << MS_SHIFT | node << SEQ_BITS
    if same_ms > floor:
        return same_ms  # `floor` is a lower node's seq in that millisecond
    if floor >> SEQ_BITS == same_ms >> SEQ_BITS and floor & _SEQ_MASK < _SEQ_MASK:
        return floor + 1
    return (ms + 1) << MS_SHIFT | node << SEQ_BITS


def node_of(seq: int) -> int:
    """The node number a seq was minted by (diagnostics, tests)."""
    return (seq >> SEQ_BITS) & (NODES - 1)


def minted_at(seq: int) -> float | None:
    """The epoch seconds a seq of this store was minted at; None for a seq harel's own
    counter handed out (too small to carry a time)."""
    ms = seq >> MS_SHIFT
    if ms <= 0 or seq < 1 << 40:
        return None
    return (ms + EPOCH_MS) / 1000.0


def age_of(seq: int, now: float) -> float | None:
    """How long ago (at `now`) a seq of this store was minted; None for one harel's own
    counter handed out (the backlog's and the execution page's pending entries' ages)."""
    born = minted_at(seq)
    return None if born is None else max(0.0, now - born)
