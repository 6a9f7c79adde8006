"""Round trips and wire time, counted by one PyMongo command listener: every client of the run,
the stores' and harel's transport's, reports to it, so the two stores are counted alike; by the
side each command addresses (store, transport) and by its kind of work (bench/common/kinds.py). It
registers itself when this module is imported, because a client only reports to the listeners
registered before it was made."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any, Iterator, Optional

from pymongo import monitoring

from bench.common.harness import Wire
from bench.common.kinds import classify, collection_of

# --- round trips, counted on the wire ----------------------------------------------------------


class Tally(monitoring.CommandListener):
    """Counts and times the commands sent while a timed section runs, by what they address:
    the store's collections (`<prefix>_executions`, `<prefix>_counters`) or the transport's.
    Both stores' clients (PyMongo, PyMongo async, Motor) report here, so the figures compare
    like for like."""

    def __init__(self) -> None:
        self.wire: Optional[Wire] = None
        self.server_pid: Optional[int] = None  # the embedded server's process, to read its CPU time
        # (connection, request id) -> ("side command" or None, kind of work)
        self._open: dict[tuple[Any, int], tuple[Optional[str], str]] = {}
        self._lock = threading.Lock()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        wire = self.wire
        if wire is None:
            return
        kind = classify(event.command_name, event.command)
        target = collection_of(event.command_name, event.command)
        side = None
        if target is None:
            pass
        elif "_transport_" in target or "_hb_" in target:  # first: harel's transport's counters end in _counters too
            side = "transport"
        elif target.endswith(("_executions", "_counters")):
            side = "store"
        with self._lock:
            wire.kinds[kind] = wire.kinds.get(kind, 0) + 1
            if side is not None:
                setattr(wire, side, getattr(wire, side) + 1)
            self._open[(event.connection_id, event.request_id)] = (side and f"{side} {event.command_name}", kind)

    def _answered(self, event: Any) -> None:
        with self._lock:
            key, kind = self._open.pop((event.connection_id, event.request_id), (None, None))
            wire = self.wire
            if kind is None or wire is None:
                return
            took = event.duration_micros / 1e6
            wire.kind_seconds[kind] = wire.kind_seconds.get(kind, 0.0) + took
            if key is not None:
                wire.seconds[key] = wire.seconds.get(key, 0.0) + took

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self._answered(event)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self._answered(event)

    @contextlib.contextmanager
    def timed(self, wire: Wire) -> Iterator[None]:
        """Count and time into `wire` the commands sent while inside (one section at a time),
        and add the CPU time this process and the server's spent meanwhile."""
        client, server = time.process_time(), _cpu_seconds(self.server_pid)
        self.wire = wire
        try:
            yield
        finally:
            self.wire = None
            wire.client_cpu += time.process_time() - client
            after = _cpu_seconds(self.server_pid)
            if server is not None and after is not None:
                wire.server_cpu = (wire.server_cpu or 0.0) + after - server
            with self._lock:
                self._open.clear()


def process_cpu_seconds(pid: Optional[int]) -> Optional[float]:
    """CPU seconds process `pid` has run, its ended threads included (Linux: user and system
    time from /proc), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _cpu_seconds(pid: Optional[int]) -> Optional[float]:
    """CPU seconds the live threads of process `pid` have run (Linux, nanosecond counters), or
    None. A timed section keeps its connections, so the server's threads serving it live
    through it."""
    if pid is None:
        return None
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return total / 1e9


TALLY = Tally()
monitoring.register(TALLY)
