"""The history record format: writing it, reading it back, and pairing invokes with outcomes.

Why this module exists: several processes of one run (workers, the client that sends events,
the test that heals the faults) write histories that one checker reads, possibly after some
of the writers were SIGKILLed mid-operation. The format and both ends of it live here, once.

One JSON object a line. Every record has:

- `t` — `time.monotonic_ns()` when it was written: one clock for every process of a machine,
  so records of different files order against one another;
- `p` — the writing process's name, and `i` — the operation's index within that process: an
  invoke and its completion share `p` and `i`;
- `type` — `invoke`, then one of `ok`, `fail` (the operation definitely did not take effect)
  or `unknown` (it may have); `info` for notes such as the faults injected;
- `f` — the operation: `create`, `commit`, `read`, `send`, `publish`, `deliver`; `final`
  and `drain` (type `ok`, written alone once the work has drained); `fault` (type `info`).

The fields each operation carries are listed in `harel_beanie.history.checker`, which reads
them. An invoke whose completion never came (its process was killed) is `incomplete`, and
counts as unknown: the operation may or may not have taken effect.

A record is written with one `write(2)` on a file opened for appending, and not fsynced: a
killed process's lines are already in the page cache, and several writers of one file never
interleave within a line. A line cut short (the machine, not the process, died) can only be
the last of its file; the reader skips it and refuses any other line it cannot read.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Union

from harel_beanie.core.arguments import require_str

#: what an invoke may end as, in a record of its own
COMPLETIONS = ("ok", "fail", "unknown")
#: what an operation ended as, seen from the history (`incomplete`: no completion was written)
OUTCOMES = (*COMPLETIONS, "incomplete")
#: records that stand alone, with no invoke (the end of a run's observations)
STANDALONE = ("final", "drain")


class HistoryWriter:
    """Appends one process's records to a history file: it stamps each with `t`, `p` and `i`.

    `invoke(f, **fields)` returns the index the completion must name; `complete(i, type,
    **fields)` ends it as `ok`, `fail` or `unknown`. `info(f, **fields)` notes something
    (a fault injected), `write(record)` appends a record made whole by the caller (`final`,
    `drain`). Each call is one system call and never waits, so one asyncio loop can share a
    writer between its tasks. Give each process (each start of a restarted one, too) its own
    name: the name and the index are what pair a completion with its invoke."""

    def __init__(self, path: Union[str, Path], process: str) -> None:
        if not isinstance(process, str) or not process:
            raise ValueError(f"process must be a non-empty name, got {process!r}")
        self.path = Path(path)
        self.process = process
        self._fd: Optional[int] = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._next = 0
        self._open: dict[int, str] = {}  # index -> operation, for invokes not yet completed

    def invoke(self, f: str, **fields: Any) -> int:
        f = require_str("f", f)  # the operation's name: what the checker pairs and groups by
        i = self._take()
        self._open[i] = f
        self._emit({**fields, "type": "invoke", "f": f}, i)
        return i

    def complete(self, i: int, type: str, **fields: Any) -> None:
        if type not in COMPLETIONS:
            raise ValueError(f"type must be one of {COMPLETIONS}, got {type!r}")
        f = self._open.pop(i, None)
        if f is None:
            raise ValueError(f"no invoke {i} of {self.process!r} is waiting for its completion")
        self._emit({**fields, "type": type, "f": f}, i)

    def info(self, f: str, **fields: Any) -> None:
        f = require_str("f", f)
        self._emit({**fields, "type": "info", "f": f}, self._take())

    def write(self, record: Mapping[str, Any]) -> None:
        """Append `record` as given, with `t`, `p` and `i` filled in where it has none."""
        rec = dict(record)
        if "type" not in rec or "f" not in rec:
            raise ValueError(f"a record needs its type and f, got {sorted(rec)}")
        i = rec.pop("i", None)
        self._emit(rec, self._take() if i is None else int(i))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take(self) -> int:
        i = self._next
        self._next += 1
        return i

    def _emit(self, record: Mapping[str, Any], i: int) -> None:
        if self._fd is None:
            raise ValueError(f"the history {self.path.name} is closed")
        # the common fields first, so a line reads in order; a record's own t or p (write) wins
        line = {"t": time.monotonic_ns(), "p": self.process, "i": i, "type": None, "f": None, **record}
        data = (json.dumps(line, separators=(",", ":"), default=str) + "\n").encode()
        while data:  # a regular file takes it in one go; a short write is finished, not lost
            data = data[os.write(self._fd, data) :]


def read_history(paths: Iterable[Union[str, Path]]) -> list[dict[str, Any]]:
    """Every record of every file, in time order (`t`, then process and index for ties). A
    torn last line is skipped; any other unreadable line is a ValueError naming it."""
    records: list[dict[str, Any]] = []
    for path in paths:
        text = Path(path).read_text(encoding="utf-8")
        lines = text.split("\n")
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            torn_tail = n == len(lines)  # no newline after it: its writer stopped mid-line
            try:
                rec = json.loads(line)
            except ValueError:
                if torn_tail:
                    continue
                raise ValueError(f"{path}:{n}: not a JSON record: {line[:80]!r}") from None
            problem = _malformed(rec)
            if problem is not None:
                raise ValueError(f"{path}:{n}: {problem}")
            records.append(rec)
    records.sort(key=lambda r: (r["t"], r["p"], r.get("i", -1)))
    return records


def _malformed(rec: Any) -> Optional[str]:
    if not isinstance(rec, dict):
        return f"a record is a JSON object, got {type(rec).__name__}"
    if not isinstance(rec.get("t"), int) or not isinstance(rec.get("p"), str):
        return "a record needs an integer t and a process name p"
    if rec.get("type") not in ("invoke", *COMPLETIONS, "info") or not isinstance(rec.get("f"), str):
        return f"a record needs a known type and an operation f, got {rec.get('type')!r}, {rec.get('f')!r}"
    if rec["type"] in ("invoke", *COMPLETIONS) and rec["f"] not in STANDALONE and not isinstance(rec.get("i"), int):
        return "an invoke or completion needs its index i"
    return None


# --- pairing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    """One invoke and what it ended as (`completion` is None: `incomplete`)."""

    invoke: Mapping[str, Any]
    completion: Optional[Mapping[str, Any]] = None

    @property
    def f(self) -> str:
        return str(self.invoke["f"])

    @property
    def exe(self) -> Optional[str]:
        return self.invoke.get("exe")

    @property
    def outcome(self) -> str:
        return "incomplete" if self.completion is None else str(self.completion["type"])

    @property
    def uncertain(self) -> bool:
        """It may or may not have taken effect: unknown, or its process died first."""
        return self.outcome in ("unknown", "incomplete")

    @property
    def invoked(self) -> int:
        return int(self.invoke["t"])

    @property
    def completed(self) -> Optional[int]:
        return None if self.completion is None else int(self.completion["t"])


@dataclass
class Paired:
    """A history sorted out: its operations (in invoke order), the records that stand alone
    (`final`, `drain`, `info`), and completions whose invoke is not in the history."""

    operations: list[Operation] = field(default_factory=list)
    standalone: list[dict[str, Any]] = field(default_factory=list)
    strays: list[dict[str, Any]] = field(default_factory=list)


def pair(records: Iterable[Mapping[str, Any]]) -> Paired:
    """Match each completion with its invoke (same `p` and `i`), in time order. An invoke
    reusing an open `(p, i)` (a process restarted under its old name) leaves the earlier
    one incomplete, as its process was."""
    out = Paired()
    open_: dict[tuple[str, int], Mapping[str, Any]] = {}
    done: list[Operation] = []
    for rec in sorted(records, key=lambda r: (r["t"], r["p"], r.get("i", -1))):
        kind = rec["type"]
        if kind == "info" or rec["f"] in STANDALONE:
            out.standalone.append(dict(rec))
            continue
        key = (rec["p"], int(rec["i"]))
        if kind == "invoke":
            earlier = open_.pop(key, None)
            if earlier is not None:
                done.append(Operation(earlier))
            open_[key] = rec
            continue
        invoke = open_.get(key)
        if invoke is None or invoke["f"] != rec["f"]:
            out.strays.append(dict(rec))
            continue
        del open_[key]
        done.append(Operation(invoke, rec))
    done.extend(Operation(rec) for rec in open_.values())
    out.operations = sorted(done, key=lambda op: (op.invoked, op.invoke["p"], op.invoke["i"]))
    return out
