"""Windows on a numeric sort key, sized so that each holds about the same number of
documents, with no I/O.

Why this module exists: on a server where `limit` does not bound the work (SecantusDB reads
every match of a query, then keeps N), a batch read as "the next N matches" costs every
match that remains, so a long run gets no faster as it goes and its first batch costs as much
as the whole. A read bounded by a range of an indexed key costs only the documents in that
range on every server. So a walk over a key reads one window at a time and sizes the next
from what the last held:

- an empty window doubles the width (the walk crosses a quiet stretch in few reads);
- one that held documents scales the width toward the target (at most doubling, at most
  dividing by eight), so each window holds about `target` documents wherever the walk is,
  and a batch at the end of a run costs what one at the start did;
- windows tile the key: each starts where the last ended, none overlaps another, and once a
  window reaches below `floor` the last one is open below, so nothing is left out.

The walk goes downward from an upper bound, the direction in which the data ends: starting
at a cut-off inside the data, it never has to cross an empty stretch before the first
document, where doubling would land on a window as wide as the stretch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from harel_beanie.core.arguments import require_int, require_time

#: the most a window shrinks after one that held too much, and the most it grows
SHRINK, GROW = 8.0, 2.0


@dataclass
class Window:
    """`low <= key < high`; `low` None: open below (the last window of a walk)."""

    low: Optional[float]
    high: float

    def query(self, field: str) -> dict[str, Any]:
        """The range as a filter on `field`."""
        bounds: dict[str, float] = {"$lt": self.high}
        if self.low is not None:
            bounds["$gte"] = self.low
        return {field: bounds}


class DownwardWalk:
    """Windows on a key from `high` down, each sized to hold about `target` documents.

    Call `next()` for a window, read it, then `saw(n)` with the number of documents the read
    returned (every document in the window: the server read them all); `done` is true once
    the window open below has been read."""

    def __init__(self, high: float, *, target: int, width: float, floor: float = 0.0) -> None:
        self.high = require_time("high", high)
        self.target = require_int("target", target, low=1)
        self.width = require_time("width", width)
        if not self.width > 0:
            raise ValueError(f"width must be above 0, got {width!r}")
        self.floor = require_time("floor", floor)
        self.done = False
        self._current: Optional[Window] = None

    def next(self) -> Window:
        if self.done:
            raise RuntimeError("the walk is over")
        low = self.high - self.width
        self._current = Window(None if low <= self.floor else low, self.high)
        return self._current

    def saw(self, n: int) -> None:
        n = require_int("n", n, low=0)
        window = self._current
        if window is None:
            raise RuntimeError("saw() before next()")
        self._current = None
        if window.low is None:
            self.done = True
            return
        self.high = window.low
        scale = GROW if n == 0 else min(GROW, max(1.0 / SHRINK, self.target / n))
        self.width = max(self.width * scale, math.ulp(self.high) * 4)


# --- windows on a string key ------------------------------------------------------------------

#: the last code point a window steps through one character at a time: past it, the position
#: to the left (ids are mostly ASCII; a step in the rest of Unicode would take 14 doublings)
_ASCII_END = 0x7F


def string_uppers(anchor: str, deepest: int) -> Iterator[tuple[int, Optional[str]]]:
    """The upper bounds (exclusive) of windows of a string key above `anchor`, widening, each
    with the position it raises (-1 for the last, None: no upper bound): from
    position `deepest` (clamped to `anchor`'s length) leftward, the character there raised by
    1, 2, 4, ... (while it stays ASCII), then the next position to the left; last, None (no
    upper bound). Each bound is above the last and above `anchor`, so windows taken from
    `anchor` up to each in turn tile the key above it.

    A window raised at position p holds the keys sharing `anchor`'s first p characters that
    follow it: each step to the left multiplies what a window can hold by the alphabet's size
    at that position (16 for hexadecimal ids), each doubling within a position by about two."""
    deepest = min(require_int("deepest", deepest, low=0), len(anchor) - 1)
    for p in range(deepest, -1, -1):
        c, d = ord(anchor[p]), 1
        while c + d <= max(_ASCII_END, c + 1):
            yield p, anchor[:p] + _char_at_least(c + d)
            if c + d > _ASCII_END:
                break
            d *= 2
    yield -1, None


def _char_at_least(code: int) -> str:
    """The character of code point `code`, or of the next one that can be encoded (a
    surrogate cannot); past the last code point, the last."""
    if 0xD800 <= code <= 0xDFFF:
        code = 0xE000
    return chr(min(code, 0x10FFFF))
