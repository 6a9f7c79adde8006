"""Counting the commands of a worker process the benchmark starts (`make bench-partitions`): the
process is run through this module, which registers a command listener before the worker makes
any client, then runs the worker's module as `python -m` would.

    python -m bench.common.tally_child harel_beanie worker --url ... # HB_BENCH_TALLY=<folder>

The listener sums, by kind of work (bench/common/kinds.py), the commands sent and their time on
the wire. The benchmark reads every worker's sums at the start and at the end of a timed drive
by asking for them: it writes a number to `<folder>/request`, each worker answers with its sums
in `<folder>/<pid>.json` tagged with that number (a thread polls every few milliseconds), and
the benchmark waits for every answer. The difference of two readings is what the workers sent
between them, whoever sent it and however long the workers run after.

Kept light on purpose: it imports nothing of the benchmark's harness, so the worker starts as
it would alone.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pymongo import monitoring

from bench.common.kinds import classify

ENV = "HB_BENCH_TALLY"
POLL = 0.005  # seconds between a worker's looks at the request file


class KindTally(monitoring.CommandListener):
    """Commands and their wire seconds (sent until answered, as the driver reports it), by kind."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self._open: dict[tuple[Any, int], str] = {}
        self._lock = threading.Lock()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        kind = classify(event.command_name, event.command)
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self._open[(event.connection_id, event.request_id)] = kind

    def _answered(self, event: Any) -> None:
        with self._lock:
            kind = self._open.pop((event.connection_id, event.request_id), None)
            if kind is not None:
                self.seconds[kind] = self.seconds.get(kind, 0.0) + event.duration_micros / 1e6

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self._answered(event)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self._answered(event)

    def reading(self) -> dict[str, Any]:
        with self._lock:
            return {"counts": dict(self.counts), "seconds": dict(self.seconds)}


def _answer(tally: KindTally, folder: Path) -> None:
    """Answer each new request in `folder` with this process's sums (the worker's thread)."""
    request, mine, answered = folder / "request", folder / f"{os.getpid()}.json", -1
    while True:
        try:
            asked = int(request.read_text() or -1)
        except (OSError, ValueError):
            asked = -1
        if asked > answered:
            tmp = mine.with_suffix(".tmp")
            tmp.write_text(json.dumps({"n": asked, **tally.reading()}))
            tmp.replace(mine)  # whole or not at all: the reader never sees half a file
            answered = asked
        time.sleep(POLL)


def read(folder: Path, processes: int, asked: int, timeout: float = 10.0) -> dict[str, Any]:
    """Ask every worker counting into `folder` (`processes` of them) for its sums, and add up
    their answers: {"counts": {kind: n}, "seconds": {kind: s}}. Request numbers must grow."""
    (folder / "request.tmp").write_text(str(asked))
    (folder / "request.tmp").replace(folder / "request")
    end = time.monotonic() + timeout
    while True:
        answers = []
        for path in folder.glob("*.json"):
            try:
                answers.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        fresh = [a for a in answers if a.get("n") == asked]
        if len(fresh) >= processes or time.monotonic() > end:
            break
        time.sleep(POLL)
    if len(fresh) < processes:
        raise TimeoutError(f"{len(fresh)} of {processes} workers answered the tally's request {asked}")
    total: dict[str, Any] = {"counts": {}, "seconds": {}}
    for a in fresh:
        for part in ("counts", "seconds"):
            for kind, v in a[part].items():
                total[part][kind] = total[part].get(kind, 0) + v
    return total


def main() -> None:
    folder = os.environ.get(ENV)
    tally = KindTally()
    monitoring.register(tally)  # before the worker's module makes a client
    if folder:
        threading.Thread(target=_answer, args=(tally, Path(folder)), daemon=True).start()
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
