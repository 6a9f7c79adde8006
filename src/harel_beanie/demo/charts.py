"""The dashboard's per-minute samples, taken by the demo at the minutes of its clock.

Why this module exists: the dashboard's last-hour charts draw the differences between
samples a dashboard takes every minute while it runs (`harel_beanie.queries.samples`). The
demo plays its last hour of shop time in seconds, so no dashboard could have sampled it:
the demo takes those samples itself, at its simulated minutes, and the charts show a run
that has just ended as they would have shown it live.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from harel_beanie.core.documents import bind
from harel_beanie.deploy.stack import LABEL
from harel_beanie.queries.samples import MINUTE, samples_name, take_sample

#: the charts' span, in minutes (`harel_beanie.dashboard.charts`, a layer the demo does not import)
SPAN = 60


#: what the charts draw: the last hour (and the minute before it, a rate's first difference)
HOUR = SPAN * MINUTE + MINUTE


class DemoSamples:
    """Samples of one database under `prefix`, on `clock`, in the hour before `end` (when
    the clock stops) only: the charts draw that hour, and the clock jumps over a week."""

    def __init__(self, database: Any, prefix: str, clock: Callable[[], float], end: float) -> None:
        self.samples = database[samples_name(prefix)]
        self.prefix = prefix
        self.clock = clock
        self.first = end - HOUR
        self.taken: set[float] = set()

    async def take(self, until: Optional[float] = None) -> None:
        """The clock's minute's sample, and the same for every minute up to `until` (the
        clock is about to jump over them: nothing happens in them), those in the last hour.
        Its reads are labelled apart from the work's round trips."""
        now = self.clock()
        if max(now, until or now) < self.first:
            return
        now = max(now, self.first)  # the state of a jumped-over minute is the one before it
        minute = now - now % MINUTE
        if minute in self.taken and until is None:
            return
        self.taken.add(minute)
        token = LABEL.set("sample")
        try:
            await take_sample(bind(self.prefix)[0], self.samples, now=now, through=until)
        finally:
            LABEL.reset(token)
