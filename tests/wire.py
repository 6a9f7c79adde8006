"""What a client sends, as the tests see it: one command listener for every test that asserts
on the wire (round trips, concerns, fail points), so they all count the same way."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from pymongo import monitoring

#: sent by the driver on its own account (closing sessions), not by the operation under test
NOT_THE_WORK = {"endSessions"}


class Recorder(monitoring.CommandListener):
    """Every command a client sends, in order, with the faults its replies carried
    (thread-safe: a store's client may send from several threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.commands: list[tuple[str, dict[str, Any]]] = []
        self.faults: Counter[str] = Counter()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in NOT_THE_WORK:
            return
        with self._lock:
            self.commands.append((event.command_name, dict(event.command)))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if "writeConcernError" in event.reply:
            with self._lock:
                self.faults["writeConcernError on " + event.command_name] += 1

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        failure = event.failure  # the server's error document, or the driver's for a network error
        what = (
            failure.get("codeName")
            or failure.get("errtype")
            or ("writeConcernError" if "writeConcernError" in failure else "error")
        )
        with self._lock:
            self.faults[f"{what} on {event.command_name}"] += 1

    def names(self) -> list[str]:
        return [n for n, _ in self.commands]

    def clear(self) -> None:
        with self._lock:
            self.commands.clear()

    def take(self) -> list[tuple[str, dict[str, Any]]]:
        """The commands sent since the last take or clear."""
        with self._lock:
            out, self.commands = self.commands, []
        return out
