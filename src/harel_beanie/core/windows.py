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
    """`low <= key < high`; `low` None: open below, `high` None: open above (the last
    window of a walk down, of a walk up)."""

    low: Optional[float]
    high: Optional[float]

    def query(self, field: str) -> dict[str, Any]:
        """The range as a filter on `field`."""
        bounds: dict[str, float] = {}
        if self.high is not None:
            bounds["$lt"] = self.high
        if self.low is not None:
            bounds["$gte"] = self.low
        return {field: bounds}


def _scaled(width: float, n: int, target: int, at: float) -> float:
    """The next window's width after one of `width` held `n` documents (see the module)."""
    scale = GROW if n == 0 else min(GROW, max(1.0 / SHRINK, target / n))
    return max(width * scale, math.ulp(at) * 4)


class _Walk:
    """What a walk either way shares: the target, the width, and `saw()` moving the edge to
    where the window just read ended.

    Call `next()` for a window, read it, then `saw(n)` with the number of documents the read
    returned (every document in the window: the server read them all); `done` is true once
    the last window, open at the walk's far end, has been read."""

    def __init__(self, edge: float, target: int, width: float) -> None:
        self.edge = edge
        self.target = require_int("target", target, low=1)
        self.width = require_time("width", width)
        if not self.width > 0:
            raise ValueError(f"width must be above 0, got {width!r}")
        self.done = False
        self._current: Optional[Window] = None

    def next(self) -> Window:
        if self.done:
            raise RuntimeError("the walk is over")
        self._current = self._window()
        return self._current

    def saw(self, n: int) -> None:
        n = require_int("n", n, low=0)
        window = self._current
        if window is None:
            raise RuntimeError("saw() before next()")
        self._current = None
        far = self._far_end(window)
        if far is None:
            self.done = True
            return
        self.edge = far
        self.width = _scaled(self.width, n, self.target, far)

    def _window(self) -> Window:
        raise NotImplementedError

    def _far_end(self, window: Window) -> Optional[float]:
        raise NotImplementedError


class DownwardWalk(_Walk):
    """Windows on a key from `high` down, each sized to hold about `target` documents; once
    a window reaches below `floor` the last one is open below."""

    def __init__(self, high: float, *, target: int, width: float, floor: float = 0.0) -> None:
        super().__init__(require_time("high", high), target, width)
        self.floor = require_time("floor", floor)

    @property
    def high(self) -> float:
        return self.edge

    def _window(self) -> Window:
        low = self.edge - self.width
        return Window(None if low <= self.floor else low, self.edge)

    def _far_end(self, window: Window) -> Optional[float]:
        return window.low


class UpwardWalk(_Walk):
    """Windows on a key from `low` up, as `DownwardWalk` the other way: the last window is
    open above, once a window would end at `high` (the read's own upper bound, None: none)
    or be wider than `widest`. For the reads that want the smallest values of a key (the
    soonest timers, the longest silent), started where the last such read found its
    smallest."""

    def __init__(
        self, low: float, *, target: int, width: float, high: Optional[float] = None, widest: float = 1e9
    ) -> None:
        super().__init__(require_time("low", low), target, width)
        self.high = None if high is None else require_time("high", high, infinite_ok=True)
        self.widest = require_time("widest", widest)

    @property
    def low(self) -> float:
        return self.edge

    def _window(self) -> Window:
        top = self.edge + self.width
        last = self.width > self.widest or (self.high is not None and top >= self.high)
        return Window(self.edge, None if last else top)

    def _far_end(self, window: Window) -> Optional[float]:
        return window.high


# --- windows on a string key ------------------------------------------------------------------


def position_uppers(anchor: str, deepest: int) -> Iterator[tuple[int, Optional[str]]]:
    """The upper bounds (exclusive) of windows of a string key above `anchor`, each a whole
    position wider than the last, with the position it raises (-1 for the last, None: no
    upper bound): from position `deepest` (clamped to `anchor`'s length) leftward, `anchor`'s
    first p characters followed by the character after `anchor[p]`; last, None. Each bound
    is above the last and above `anchor`, so windows taken from `anchor` up to each in turn
    tile the key above it.

    The window raised at position p holds the keys that share `anchor`'s first p characters
    and follow it: each step multiplies what a window can hold by the alphabet's size at that
    position (16 for hexadecimal ids), so a walk reaches any density in as few reads as the
    key has positions, and the window that fills a page holds at most one alphabet's worth of
    pages."""
    deepest = min(require_int("deepest", deepest, low=0), len(anchor) - 1)
    last: Optional[str] = None
    for p in range(deepest, -1, -1):
        upper = anchor[:p] + _char_at_least(ord(anchor[p]) + 1)
        if upper > anchor and (last is None or upper > last):  # the last code point has no successor
            last = upper
            yield p, upper
    yield -1, None


def _char_at_least(code: int) -> str:
    """The character of code point `code`, or of the next one that can be encoded (a
    surrogate cannot); past the last code point, the last."""
    if 0xD800 <= code <= 0xDFFF:
        code = 0xE000
    return chr(min(code, 0x10FFFF))
