"""Where a claim reads: windows of the claim key (`available_at`) from the lowest key the last
claim found, each sized to hold a few documents, with no I/O.

Why this module exists: a claim wants the due group with the lowest `available_at`. On a
server whose `limit` bounds its work (mongod) that is one sorted query; on one that reads
every match before keeping the first (SecantusDB), the same query costs every due group, 1.1 s
with 10,000 queued. A range of `available_at` that holds few documents costs only those on
both, when the server answers it from an index (on SecantusDB: a filter of exactly that range
and the `hb_claim` index's own partial filter, see `harel_beanie.transport.queues`, Rule 3).
So a claim reads windows of the key in turn (`harel_beanie.core.windows.UpwardWalk`), from
where the last claim found its lowest, up to now:

- the first window is open below: it holds whatever went below the kept start since the
  last claim (a group given back, a lease that ended early by another clock), so nothing is
  left out, and it costs nothing more while nothing did;
- a window that returned as many documents as it asked for may have held more (the server
  read them all and the limit hid how many): the next read starts at the last key returned,
  with a width narrowed to the stretch that held them, so the next claim reads about as many;
- the next claim starts at the lowest key this one read and did not take, or, if it took
  all it read, where its reads ended: below that, only a write made since can put a group,
  and the first window reads it;
- a walk that found nothing due widens its windows to the stretch it crossed (at most
  `WIDTH`), so an idle worker's claim is one read.

The very first claim of a process, with no start kept, reads every due group once (one read,
bounded by its limit in what it returns, not in what the server reads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Generator, Optional

from harel_beanie.core.windows import SHRINK, UpwardWalk

#: documents a claim's window is sized to hold (at least: a claim of k groups sizes it to k)
TARGET = 8
#: documents a read returns at most, per group wanted (at least `READ`): a limit on the reply,
#: which on SecantusDB bounds what is sent, not what is read
READ = 64
#: the width a walk starts with, and the most an empty walk widens it to (seconds): a
#: claim after a quiet second crosses it in one read, and a burst that lands in one window
#: after a quiet spell costs one read of what arrived in at most this long
WIDTH = 1.0
#: a read of tied keys (a clock that does not move) that filled its reply is read again with a
#: limit this many times larger, so a walk never stalls on a key
BOOST = 4

#: a fresh group's key: the time it was published less this (about 544 years), so that every
#: fresh key is below every served one (Rule 3 of `harel_beanie.transport.queues`) for any
#: clock reading from 0 to 2**33 (the year 2242), and in publish order among them
FRESH_OFFSET = float(2**34)
#: the boundary between the bands: fresh keys are below it, served keys at or above it
SERVED_FLOOR = -float(2**33)


@dataclass(frozen=True)
class Band:
    """A stretch of the claim key a claim walks on its own: `floor <= key`, and below the
    band's ceiling (up to it with `inclusive`)."""

    name: str
    floor: float
    top: Optional[float]  # None: now
    inclusive: bool

    def ceiling(self, now: float) -> float:
        return now if self.top is None else min(self.top, now)


#: the fresh groups first (never served, or drained since), then the served ones, due by now
BANDS = (Band("fresh", -math.inf, SERVED_FLOOR, False), Band("served", SERVED_FLOOR, None, True))

Bounds = dict[str, float]
Step = tuple[Bounds, int]


@dataclass
class ClaimWalk:
    """The start and width one claim filter's windows begin from (per process, per filter)."""

    start: Optional[float] = None
    width: float = WIDTH
    # what the claim under way read: the keys of the documents, and how far up it has read
    _keys: dict[Any, float] = field(default_factory=dict)
    _top: Optional[float] = None

    def windows(
        self, floor: float, high: float, inclusive: bool, want: int
    ) -> Generator[Step, list[dict[str, Any]], None]:
        """Yields the `available_at` bounds of each read (at least `floor`, below `high`, or
        up to it with `inclusive`) and its limit; is sent back the documents the read returned
        (in claim order). `settle()` when the claim is done."""
        self._keys, self._top = {}, None
        limit = max(READ, 4 * want)
        cap = "$lte" if inclusive else "$lt"
        if self.start is None or not floor <= self.start <= high:
            low, learnt = floor, False
            while True:  # the band whole, a reply at a time
                docs = yield {"$gte": low, cap: high}, limit
                self._saw(docs, high, limit)
                keys = [float(d["available_at"]) for d in docs]
                if not learnt and len(keys) >= max(TARGET, want):  # dense enough to learn a width from
                    span = keys[max(TARGET, want) - 1] - keys[0]
                    self.width, learnt = max(span, math.ulp(keys[0]) * 4), True
                if len(docs) < limit:
                    return
                if keys[-1] == keys[0] or keys[-1] <= low:
                    limit *= BOOST  # all tied: read the key again with room for them all
                low = keys[-1]
        walk = UpwardWalk(self.start, target=max(TARGET, want), width=self.width, high=high)
        low = floor  # the first window is open below, down to the band's floor
        while not walk.done:
            window = walk.next()
            top = high if window.high is None or window.high >= high else window.high
            bounds: Bounds = {"$gte": low, (cap if top == high else "$lt"): top}
            docs = yield bounds, limit
            self._saw(docs, top, limit)
            if len(docs) >= limit:
                # a full reply: go on from the last key returned, in a narrower window
                least, last = float(docs[0]["available_at"]), float(docs[-1]["available_at"])
                if last == least or last <= low:
                    limit *= BOOST  # all tied: read the key again with room for them all
                walk.edge = last
                walk.width = max(min(walk.width, (last - least) or walk.width / SHRINK), math.ulp(last) * 4)
                low = last
                continue
            walk.saw(len(docs))
            low = walk.edge
        # a stretch with nothing due: the next claim crosses one as long in one read
        if not self._keys and self.start < high:
            walk.width = max(walk.width, min(high - self.start, WIDTH))
        self.width = walk.width

    def _saw(self, docs: list[dict[str, Any]], top: float, limit: int) -> None:
        self._keys.update((d["_id"], float(d["available_at"])) for d in docs)
        # a full reply saw up to its last key; any other, up to where its window ended
        self._top = float(docs[-1]["available_at"]) if len(docs) >= limit else top

    def settle(self, taken: set[Any]) -> None:
        """After the claim: the next one starts at the lowest key it read and did not take
        (still waiting, or taken by another claimer), else where its reads ended (every
        key below was read: what was there it took). Below that start only a write made
        since can put anything, and the next claim's first window, open below, reads it."""
        left = [key for group, key in self._keys.items() if group not in taken]
        if left:
            self.start = min(left)
        elif self._top is not None:
            self.start = self._top
