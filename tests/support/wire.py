"""What a client sends, as the tests see it: one command listener for every test that asserts
on the wire (round trips, concerns, fail points), so they all count the same way."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, NamedTuple, Optional

from pymongo import monitoring

#: sent by the driver on its own account (closing sessions), not by the operation under test
NOT_THE_WORK = {"endSessions"}


class Hit(NamedTuple):
    """A fault a reply carried, with the command it answered."""

    at: int  # the command's index in `Recorder.commands` (-1: a command not recorded)
    fault: str  # the reply's codeName, the driver's error type, or "writeConcernError"
    name: str  # the command's name
    command: dict[str, Any]  # the command as sent ({} when not recorded)
    connection: Optional[int]  # the server's id of the connection it went on, when it said

    @property
    def collection(self) -> str:
        target = self.command.get(self.name)
        return target if isinstance(target, str) else ""


class Recorder(monitoring.CommandListener):
    """Every command a client sends, in order, with the faults its replies carried
    (thread-safe: a store's client may send from several threads). `faults` counts them by
    kind and command name; `hits` says which command each one answered. `write_errors` holds
    the codes of the write errors a successful reply carried (a duplicate key, say), by the
    command's index. Indexes refer to `commands` as it was then: a test that clears or takes
    commands compares commands, not indexes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.commands: list[tuple[str, dict[str, Any]]] = []
        self.faults: Counter[str] = Counter()
        self.hits: list[Hit] = []
        self.write_errors: dict[int, list[int]] = {}
        self.returned: dict[int, int] = {}  # documents a read's reply carried, by command index
        self._in_flight: dict[tuple[Any, int], int] = {}  # (server, request id) -> index
        #: documents the replies returned, by collection (cleared with the commands)
        self.returned_in: Counter[str] = Counter()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in NOT_THE_WORK:
            return
        with self._lock:
            self._in_flight[(event.connection_id, event.request_id)] = len(self.commands)
            self.commands.append((event.command_name, dict(event.command)))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        with self._lock:
            at = self._in_flight.pop((event.connection_id, event.request_id), -1)
            cursor = event.reply.get("cursor")
            if isinstance(cursor, dict):  # the documents a find, an aggregate or a getMore returned
                batch = cursor.get("firstBatch", cursor.get("nextBatch")) or []
                if at >= 0:  # by the command's index (a cursor's batches)
                    self.returned[at] = self.returned.get(at, 0) + len(batch)
                self.returned_in[str(cursor.get("ns", "")).split(".", 1)[-1]] += len(batch)
            if "writeConcernError" in event.reply:
                self._hit(at, "writeConcernError", event)
            if event.reply.get("writeErrors") and at >= 0:
                self.write_errors[at] = [e.get("code") for e in event.reply["writeErrors"]]

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        # the server's reply, the driver's document for a network error, or (a reply the driver
        # raised on for its writeConcernError alone, as for findAndModify) that error, not a reply
        failure = event.failure
        what = (
            failure.get("codeName")
            or failure.get("errtype")
            or ("writeConcernError" if "writeConcernError" in failure or "ok" not in failure else "error")
        )
        with self._lock:
            at = self._in_flight.pop((event.connection_id, event.request_id), -1)
            self._hit(at, what, event)

    def _hit(self, at: int, what: str, event: monitoring.CommandSucceededEvent | monitoring.CommandFailedEvent) -> None:
        name = event.command_name
        self.faults[f"{what} on {name}"] += 1
        if not (0 <= at < len(self.commands) and self.commands[at][0] == name):
            at = -1
        self.hits.append(Hit(at, what, name, self.commands[at][1] if at >= 0 else {}, event.server_connection_id))

    def names(self) -> list[str]:
        return [n for n, _ in self.commands]

    def clear(self) -> None:
        with self._lock:
            self.commands.clear()
            self.returned.clear()
            self.returned_in.clear()
            self._in_flight.clear()

    def read_from(self, collection: str) -> int:
        """The documents the reads on `collection` returned since the last clear."""
        with self._lock:
            named = [
                i
                for i, (n, c) in enumerate(self.commands)
                if c.get(n) == collection or (n == "getMore" and c.get("collection") == collection)
            ]
            return sum(self.returned.get(i, 0) for i in named)

    def take(self) -> list[tuple[str, dict[str, Any]]]:
        """The commands sent since the last take or clear."""
        with self._lock:
            out, self.commands = self.commands, []
            self._in_flight.clear()
        return out
