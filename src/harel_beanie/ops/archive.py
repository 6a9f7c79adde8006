"""Where prune puts what it removes: a JSON Lines file or a collection, each fed through a
journal so that every removed execution lands there exactly once and whole, whatever instant
the process is killed at.

Why this module exists: the archive is the only copy of what prune removed. The protocol a
batch follows, for both kinds of archive:

Rule 1. `begin(batch)`: the batch's documents are written to the journal (`FILE.pending`,
        flushed and fsynced, or the collection `<NAME>_pending`) before anything is deleted.
Rule 2. prune deletes; `finish(removed)` appends what was really removed to the archive
        (flushed and fsynced), then clears the journal.
Rule 3. `recover()`, at the start of every run, settles a journal left by a killed run: the
        documents of it that are gone from the executions and not yet in the archive are
        appended, then the journal is cleared. A kill before the deletes leaves nothing gone
        (nothing is appended); a kill during or after them leaves the gone ones to append; a
        kill after the append finds them in the archive already (nothing appended twice).
Rule 4. A file's torn tail (a kill in the middle of an append) is cut off before anything is
        appended, and kept beside the file as `FILE.torn`: the records it held are still in
        the journal, so Rule 3 appends them whole. The file therefore only ever grows by
        whole lines, each one MongoDB Extended JSON document (what `mongoimport` reads).
Rule 5. The reader (`read_jsonl`) keeps every good record and reports each line it cannot
        read by its line number, rather than stopping at the first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bson import json_util
from pymongo import ReplaceOne

_CANONICAL = json_util.CANONICAL_JSON_OPTIONS


class Archive(Protocol):
    async def recover(self, executions: Any) -> int: ...
    async def begin(self, docs: list[dict[str, Any]]) -> None: ...
    async def finish(self, removed: list[dict[str, Any]]) -> None: ...


async def gone(executions: Any, ids: list[str]) -> set[str]:
    """Which of `ids` no longer exist."""
    present = await executions.find({"_id": {"$in": ids}}, {"_id": 1}).to_list(None)
    return set(ids) - {d["_id"] for d in present}


@dataclass
class CorruptLine:
    """A line of an archive file that is not one Extended JSON document."""

    number: int  # 1-based, as an editor shows it
    error: str
    text: str  # the start of the line


@dataclass
class ArchiveContents:
    records: list[dict[str, Any]] = field(default_factory=list)
    corrupt: list[CorruptLine] = field(default_factory=list)


def lines_of(docs: list[dict[str, Any]]) -> str:
    """The documents as archive lines: one canonical Extended JSON document each."""
    return "".join(json_util.dumps(d, json_options=_CANONICAL) + "\n" for d in docs)


def read_jsonl(path: os.PathLike[str] | str) -> ArchiveContents:
    """Every record of an archive (or journal) file, and every line that is not one (Rule 5).
    A missing file holds nothing."""
    out = ArchiveContents()
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return out
    with f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                record = json_util.loads(raw.decode("utf-8"), json_options=_CANONICAL)
                if not isinstance(record, dict) or "_id" not in record:
                    raise ValueError("not a document with an _id")
            except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
                out.corrupt.append(CorruptLine(number, str(exc)[:200], raw[:120].decode("utf-8", "replace")))
            else:
                out.records.append(record)
    return out


def _fsync_dir(path: Path) -> None:
    """Make a file's creation or removal itself durable (its directory entry)."""
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, text: str, mode: str) -> None:
    with open(path, mode, encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())  # on disk before the next step of the protocol relies on it
    _fsync_dir(path)


def repair_tail(path: Path) -> int:
    """Cut a torn last line off `path` (Rule 4), keeping the cut bytes in `path.torn`.
    Returns how many bytes were cut (0 for a file that ends with a whole line)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return 0
        # find the end of the last whole line, reading back a block at a time
        end, block = size, 65536
        keep = 0
        while end > 0:
            start = max(0, end - block)
            f.seek(start)
            chunk = f.read(end - start)
            at = chunk.rfind(b"\n")
            if at >= 0:
                keep = start + at + 1
                break
            end = start
        f.seek(keep)
        torn = f.read()
        with open(path.with_name(path.name + ".torn"), "ab") as side:
            side.write(torn + b"\n")
            side.flush()
            os.fsync(side.fileno())
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return size - keep


class JsonlArchive:
    """Removed executions appended to a JSON Lines file, one document per line in MongoDB
    Extended JSON (`mongoimport` reads it back), through the journal `FILE.pending`."""

    def __init__(self, path: os.PathLike[str] | str) -> None:
        self.path = Path(path)
        self.pending = self.path.with_name(self.path.name + ".pending")

    def read(self) -> ArchiveContents:
        """What the archive holds, and the lines it could not read."""
        return read_jsonl(self.path)

    def ids(self) -> set[str]:
        return {d["_id"] for d in self.read().records}

    def _append(self, docs: list[dict[str, Any]]) -> None:
        repair_tail(self.path)  # Rule 4: never append after a torn line
        _write(self.path, lines_of(docs), "a")

    async def recover(self, executions: Any) -> int:
        repair_tail(self.path)
        if not self.pending.exists():
            return 0
        # a torn journal line was never followed by a delete (Rule 1): its record is still
        # stored, so reading only the whole lines loses nothing
        journal = read_jsonl(self.pending).records
        removed = await gone(executions, [d["_id"] for d in journal]) if journal else set()
        have = self.ids() if removed else set()
        late = [d for d in journal if d["_id"] in removed and d["_id"] not in have]
        if late:
            self._append(late)
        self.pending.unlink()
        _fsync_dir(self.pending)
        return len(late)

    async def begin(self, docs: list[dict[str, Any]]) -> None:
        _write(self.pending, lines_of(docs), "w")

    async def finish(self, removed: list[dict[str, Any]]) -> None:
        if removed:
            self._append(removed)
        self.pending.unlink()
        _fsync_dir(self.pending)


class CollectionArchive:
    """Removed executions copied, as they were, into a collection of the same database
    (`_id` kept, so copying one back restores it), through the journal `<NAME>_pending`."""

    def __init__(self, db: Any, name: str) -> None:
        self.coll = db[name]
        self.journal = db[name + "_pending"]

    async def _copy(self, docs: list[dict[str, Any]]) -> None:
        if docs:  # replace by _id: copying twice leaves one copy
            await self.coll.bulk_write([ReplaceOne({"_id": d["_id"]}, d, upsert=True) for d in docs], ordered=False)

    async def recover(self, executions: Any) -> int:
        journal = await self.journal.find({}).to_list(None)
        if not journal:
            return 0
        removed = await gone(executions, [d["_id"] for d in journal])
        late = [d for d in journal if d["_id"] in removed]
        await self._copy(late)
        await self.journal.delete_many({"_id": {"$in": [d["_id"] for d in journal]}})
        return len(late)

    async def begin(self, docs: list[dict[str, Any]]) -> None:
        await self.journal.bulk_write([ReplaceOne({"_id": d["_id"]}, d, upsert=True) for d in docs], ordered=False)

    async def finish(self, removed: list[dict[str, Any]]) -> None:
        await self._copy(removed)
        await self.journal.delete_many({})
