"""Figures a reliability test reports about its own run, for docs/RELIABILITY.md.

A test takes the `figures` fixture and records what it did (`figures.add(conflicts=12)`,
`figures.set(wins=72)`). When the environment variable `HAREL_BEANIE_FIGURES` names a file,
each test's figures are appended to it as one JSON line keyed by the test's node id, and
the session adds one line describing the run (server, versions, machine); otherwise the
fixture records nothing and costs nothing. `docs/reliability.py` runs the tests with the
variable set and renders the document from those lines.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import threading
import time
from typing import Any, Optional

ENV = "HAREL_BEANIE_FIGURES"


def target() -> Optional[str]:
    return os.environ.get(ENV) or None


_lock = threading.Lock()


def write(record: dict[str, Any]) -> None:
    """Append one JSON line to the figures file, if recording is on."""
    path = target()
    if path is None:
        return
    line = json.dumps(record, sort_keys=True, default=_plain)
    with _lock, open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")


def _plain(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value, key=repr)
    return str(value)


class Figures:
    """What one test records. Numbers passed to `add` are summed over calls (a count kept
    across the examples of a property, the rounds of a loop); `set` replaces."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid
        self.values: dict[str, Any] = {}
        self._lock = threading.Lock()

    def add(self, **values: Any) -> None:
        with self._lock:
            for key, value in values.items():
                old = self.values.get(key)
                numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
                if numeric and isinstance(old, (int, float)) and not isinstance(old, bool):
                    self.values[key] = old + value
                else:
                    self.values[key] = value

    def set(self, **values: Any) -> None:
        with self._lock:
            self.values.update(values)

    def flush(self, seconds: float) -> None:
        if self.values:
            write({"kind": "test", "test": self.nodeid, "figures": self.values, "seconds": round(seconds, 2)})


def session_record(server: dict[str, Any]) -> dict[str, Any]:
    """What the run was made on: the server (its `buildInfo` and topology), the versions of
    what the store runs with, the machine."""
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return {
        "kind": "session",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "server": server,
        "packages": {n: ver(n) for n in ("harel-beanie", "harel", "pymongo", "beanie", "secantusdb", "hypothesis")},
        "python": sys.version.split()[0],
        "machine": {
            "system": f"{platform.system()} {platform.release()}",
            "arch": platform.machine(),
            "cpus": os.cpu_count(),
        },
    }
