"""The clock every process of a crash run shares: business time that runs faster than real
time, stops while the run is stopped, and jumps when the run says so.

The models' timers are long (a 15-minute cooling-off, payment backoffs of seconds, a 7-day
lost-parcel timeout) and a crash run must agree on time across a worker that is killed and
restarted many times. So every process reads the time from one small JSON file:

    now = base                                   while frozen (start is null)
    now = base + (time.time() - start) * speed   while running

The test (the only writer) freezes the clock while no worker is up or the server is down,
so an outage the test causes does not make a payment's retry late against its budget (the
models' outcomes depend on timers firing in order, not on how long an outage lasted), and
jumps it forward at the points where a long timer must come due (`jump`). The file is
replaced atomically; readers re-read it only when it changed. Time never goes backwards in
a reader.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional, Union


class SharedClock:
    """A reader of the clock file: call it for the time (pass it to harel as `clock=`)."""

    def __init__(self, path: Union[str, Path]) -> None:
        self.path = Path(path)
        self._key: Optional[tuple[int, int, int]] = None
        self._base = 0.0
        self._start: Optional[float] = None
        self._speed = 1.0
        self._last = 0.0

    def _refresh(self) -> None:
        st = os.stat(self.path)
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._key:
            state = json.loads(self.path.read_text())
            self._base, self._start, self._speed = float(state["base"]), state["start"], float(state["speed"])
            self._key = key

    def __call__(self) -> float:
        self._refresh()
        now = self._base if self._start is None else self._base + (time.time() - float(self._start)) * self._speed
        self._last = max(self._last, now)
        return self._last


class ClockControl:
    """The writer: the test's handle on the shared clock, and a reader of it itself.
    `hold()` / `release()` nest: the clock runs only when nothing holds it."""

    def __init__(self, path: Union[str, Path], *, start: float, speed: float) -> None:
        self.path = Path(path)
        self.speed = float(speed)
        self._base = float(start)
        self._start: Optional[float] = None
        self._holds = 1  # frozen until the first release (no worker yet)
        self._write()

    def __call__(self) -> float:
        if self._start is None:
            return self._base
        return self._base + (time.time() - self._start) * self.speed

    @property
    def frozen(self) -> bool:
        return self._start is None

    def hold(self) -> None:
        if self._holds == 0:
            self._base, self._start = self(), None
            self._write()
        self._holds += 1

    def release(self) -> None:
        if self._holds == 0:
            raise RuntimeError("release() without hold()")
        self._holds -= 1
        if self._holds == 0:
            self._start = time.time()
            self._write()

    def jump(self, seconds: float) -> None:
        """Move business time forward by `seconds` at once."""
        if seconds < 0:
            raise ValueError("the clock does not go back")
        self._base, self._start = self() + seconds, (None if self._start is None else time.time())
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"base": self._base, "start": self._start, "speed": self.speed}))
        os.replace(tmp, self.path)
