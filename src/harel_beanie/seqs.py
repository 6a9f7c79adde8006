"""Outbox and spawn seqs without a shared counter.

harel acks outbox entries and spawns by `seq` alone, so a seq must be unique across the whole
database, and harel delivers pending entries oldest first. harel's MongoStore gets both from a
global counter document that every commit with an emit must `$inc` first: one extra round
trip per commit, on one document every worker contends on.

Here a store instance mints seqs itself, in the Snowflake layout:

    milliseconds since 2024-01-01 (41 bits) | node (10 bits) | sequence within the ms (12 bits)

so a seq is a positive int64 (good until 2093), ordered by time, and unique as long as no two
live store instances share a node number. A store takes its node number once, when it starts,
from a counter in the counters collection (1,024 distinct numbers; a store would have to live
through 1,023 others starting before it could share one). A seq burned by a commit that lost
its CAS is a harmless gap.

Clocks of different machines disagree, so time alone does not keep one execution's seqs
increasing when two workers advance it in turn. The commit therefore carries the execution's
highest seq (`seq_hi`) in its CAS filter; a writer whose clock is behind is told so by the
server and mints again above it (see `harel_beanie.commit`).

These seqs are far above any value harel's counter hands out (2^22 times the milliseconds
elapsed since 2024), so they never collide with entries harel's store left pending.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

EPOCH_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
NODE_BITS = 10
SEQ_BITS = 12
NODES = 1 << NODE_BITS
_SEQ_MASK = (1 << SEQ_BITS) - 1


class SeqMint:
    """Hands out unique, time-ordered seqs for one store instance (thread-safe)."""

    def __init__(self, node: int, clock_ms: Callable[[], int] | None = None) -> None:
        if not 0 <= node < NODES:
            raise ValueError(f"node must be in [0, {NODES}), got {node}")
        self.node = node
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._last = 0  # the last seq handed out
        self._lock = threading.Lock()

    def take(self, count: int, above: int = 0) -> list[int]:
        """`count` fresh seqs, increasing, each greater than `above` and every earlier one."""
        with self._lock:
            floor = max(self._last, above)
            out = []
            for _ in range(count):
                now = (self._clock_ms() - EPOCH_MS) << (NODE_BITS + SEQ_BITS) | self.node << SEQ_BITS
                if now > floor:
                    seq = now
                else:
                    # same millisecond (or the clock is behind `above`): the next free slot
                    # of this node after `floor`; carrying into the ms bits is fine, it is
                    # only ever a later time for the same node
                    seq = self._next_slot(floor)
                out.append(seq)
                floor = seq
            self._last = floor
            return out

    def _next_slot(self, floor: int) -> int:
        ms_node = floor >> SEQ_BITS
        if ms_node & (NODES - 1) == self.node and floor & _SEQ_MASK < _SEQ_MASK:
            return floor + 1
        # move to the first slot of this node in the next millisecond past `floor`
        ms = (floor >> (NODE_BITS + SEQ_BITS)) + 1
        return ms << (NODE_BITS + SEQ_BITS) | self.node << SEQ_BITS


def node_of(seq: int) -> int:
    """The node number a seq was minted by (diagnostics, tests)."""
    return (seq >> SEQ_BITS) & (NODES - 1)


def minted_at(seq: int) -> float | None:
    """The epoch seconds a seq of this store was minted at; None for a seq harel's own
    counter handed out (too small to carry a time)."""
    ms = seq >> (NODE_BITS + SEQ_BITS)
    if ms <= 0 or seq < 1 << 40:
        return None
    return (ms + EPOCH_MS) / 1000.0
