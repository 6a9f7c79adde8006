"""Where prune puts what it removes: a JSON Lines file or a collection, each fed through a
journal so that every removal lands there exactly once and whole, whatever instant the
process is killed at.

Why this module exists: the archive is the only copy of what prune removed. An id may be
created again once prune removed it (prune leaves no tombstone), so one id can be removed
many times, once per incarnation; the archive is keyed by removal, not by id.

Rule 1. A removal key (an ObjectId) is minted for each document when its record is written
        to the journal. The record carries it as `_id`, beside `execution_id`, `pruned_at`
        (epoch seconds) and the whole `document`; the archive holds the same records.
Rule 2. `begin(batch)`: the batch's records are written to the journal (`FILE.pending`,
        flushed and fsynced, or the collection `<NAME>_pending`) before anything is deleted.
Rule 3. prune deletes, each delete guarded on the incarnation read (`identity`: its `born`,
        else its `created_at`); `finish(removed)` appends the records of what was really
        removed to the archive (flushed and fsynced), then clears the journal.
Rule 4. `recover()`, at the start of every run, settles a journal left by a killed run: the
        records whose incarnation is gone from the executions (the id absent, or another
        incarnation not descending from it: `gone_among`; a purge is no removal) and whose
        removal key is not yet in the archive are appended; then the journal is cleared of
        all but the records of documents still marked leaving less than `LEASE` ago (another
        prune's batch, going on now: it appends them itself, or a later run does once they
        are gone). A removal journals only what it holds (`removal.hold`), so a record gone
        is its removal's, no other prune's. A kill before the deletes leaves nothing gone;
        a kill during or after them leaves the gone ones to append; a kill after the append
        finds their keys in the archive (nothing appended twice). Comparing keys, not ids,
        is what keeps a re-created id's second removal from passing for its first.
Rule 5. A file's torn tail (a kill in the middle of an append) is cut off before anything is
        appended, and kept beside the file as `FILE.torn`: the records it held are still in
        the journal, so Rule 4 appends them whole. The file therefore only ever grows by
        whole lines, each one MongoDB Extended JSON document (what `mongoimport` reads, into
        a collection of the collection archive's shape).
Rule 6. The reader (`read_jsonl`, `CollectionArchive.read`) keeps every good record and
        reports each line it cannot read by its line number, rather than stopping at the
        first; `ArchiveContents.removals` names each record's removal key and incarnation.

Archives written before removal keys hold the stored documents themselves (`_id` the
execution id): the reader and recovery take such a record as a removal whose key is that id.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from bson import ObjectId, json_util
from pymongo import ASCENDING, ReplaceOne

from harel_beanie.core.arguments import require_str, require_time

_CANONICAL = json_util.CANONICAL_JSON_OPTIONS
#: the archive collection's index: one execution's removals in order (`read(execution_id)`)
EXECUTION_INDEX = "hb_archive_execution"


class Archive(Protocol):
    async def recover(self, executions: Any, now: Optional[float] = None) -> int: ...
    async def begin(self, docs: list[dict[str, Any]]) -> None: ...
    async def finish(self, removed: list[dict[str, Any]]) -> None: ...


def identity(doc: dict[str, Any]) -> dict[str, Any]:
    """What tells this incarnation of an id from another: the token of the commit that
    created it (`born`), else (a document harel's own store wrote) its `created_at`, else
    nothing beyond the id."""
    if doc.get("born"):
        return {"born": doc["born"]}
    if doc.get("created_at") is not None:
        return {"created_at": doc["created_at"]}
    return {}


#: which removal marked a document leaving (its token), and when (epoch seconds)
LEAVER, LEFT_AT = "lby", "lat"
#: how long a removal's leaving mark keeps another from taking the document over, and keeps
#: its journal record for a later settling (Rule 4): past it, the removal that made it is
#: taken as killed (a batch's removal takes seconds), and the next prune removes what it left
LEASE = 300.0
#: what `gone_among` and `journal_states` need of the stored documents
GONE_PROJECTION = {"born": 1, "created_at": 1, "tomb": 1, "buried": 1, "leaving": 1, LEFT_AT: 1}


async def are_gone(executions: Any, docs: list[dict[str, Any]]) -> list[bool]:
    """For each of `docs` (as read), whether prune removed that incarnation: its id is
    absent, or holds another incarnation (created again since) that does not descend from it;
    not where a purge buried it (a tombstone, or a creation over that tombstone, naming its
    `born` among the incarnations buried): a purge is not a removal to archive."""
    ids = list({d["_id"] for d in docs})
    found = await executions.find({"_id": {"$in": ids}}, GONE_PROJECTION).to_list(None)
    return gone_among(found, docs)


async def journal_states(executions: Any, docs: list[dict[str, Any]], now: float) -> list[str]:
    """For each of `docs` (a journal's records' documents): "gone" (removed: `gone_among`),
    "held" (still stored and marked leaving less than `LEASE` ago: its removal may be going
    on, in another prune), or "left" (stored and not being removed)."""
    ids = list({d["_id"] for d in docs})
    found = await executions.find({"_id": {"$in": ids}}, GONE_PROJECTION).to_list(None)
    stored = {p["_id"]: p for p in found}
    out = []
    for d, went in zip(docs, gone_among(found, docs)):
        p = stored.get(d["_id"]) or {}
        at = p.get(LEFT_AT)
        held = bool(p.get("leaving")) and isinstance(at, (int, float)) and now - at < LEASE
        out.append("gone" if went else "held" if held else "left")
    return out


def gone_among(found: list[dict[str, Any]], docs: list[dict[str, Any]]) -> list[bool]:
    """`are_gone` from `found`, the documents stored under the ids of `docs` (projected
    with `GONE_PROJECTION`)."""
    stored = {p["_id"]: p for p in found}

    def still(d: dict[str, Any]) -> bool:
        p = stored.get(d["_id"])
        if p is None:
            return False
        born = d.get("born")
        if born and born in [*((p.get("tomb") or {}).get("buried") or ()), *(p.get("buried") or ())]:
            return True  # purged, not pruned: its lineage goes on under the id
        return "tomb" not in p and all(p.get(k) == v for k, v in identity(d).items())

    return [not still(d) for d in docs]


def _now(now: Optional[float]) -> float:
    return time.time() if now is None else now


def removal_record(doc: dict[str, Any], now: float) -> dict[str, Any]:
    """The journal's and the archive's record of removing `doc` (Rule 1)."""
    return {"_id": ObjectId(), "execution_id": doc["_id"], "pruned_at": now, "document": doc}


def document_of(record: dict[str, Any]) -> dict[str, Any]:
    """The removed document a record holds (an archive from before removal keys holds it
    as the record itself)."""
    inner = record.get("document")
    return inner if isinstance(inner, dict) and "execution_id" in record else record


@dataclass
class Removal:
    """One archived removal, as the reader names it."""

    key: Any  # the removal key (the record's `_id`): an ObjectId, or an older archive's id
    execution_id: str
    incarnation: int  # 1 for this id's first removal in the archive, 2 for the next, ...
    pruned_at: float | None  # when its journal record was written (None: an older archive)
    document: dict[str, Any]


@dataclass
class CorruptLine:
    """A line of an archive file that is not one Extended JSON document."""

    number: int  # 1-based, as an editor shows it
    error: str
    text: str  # the start of the line


@dataclass
class ArchiveContents:
    records: list[dict[str, Any]] = field(default_factory=list)  # in archive order
    corrupt: list[CorruptLine] = field(default_factory=list)

    @property
    def removals(self) -> list[Removal]:
        """Every record as a removal, numbered per execution id in archive order: a file
        grows in the order removals happen, and an incarnation is removed before the next
        one of its id can exist (a killed run's removal is settled first by the next run)."""
        seen: dict[Any, int] = {}
        out = []
        for r in self.records:
            eid = r.get("execution_id", r["_id"])
            seen[eid] = seen.get(eid, 0) + 1
            out.append(Removal(r["_id"], eid, seen[eid], r.get("pruned_at"), document_of(r)))
        return out

    def keys(self) -> set[Any]:
        return {r["_id"] for r in self.records}


def lines_of(docs: list[dict[str, Any]]) -> str:
    """The records as archive lines: one canonical Extended JSON document each."""
    return "".join(json_util.dumps(d, json_options=_CANONICAL) + "\n" for d in docs)


def read_jsonl(path: os.PathLike[str] | str) -> ArchiveContents:
    """Every record of an archive (or journal) file, and every line that is not one (Rule 6).
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
    """Cut a torn last line off `path` (Rule 5), keeping the cut bytes in `path.torn`.
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
    """Removals appended to a JSON Lines file, one record per line in MongoDB Extended JSON
    (`mongoimport` reads it back), through the journal `FILE.pending`."""

    def __init__(self, path: os.PathLike[str] | str, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.pending = self.path.with_name(self.path.name + ".pending")
        self.clock = clock
        self._batch: dict[str, dict[str, Any]] = {}  # execution id -> its record, begin to finish

    def read(self) -> ArchiveContents:
        """What the archive holds, and the lines it could not read."""
        return read_jsonl(self.path)

    def _append(self, records: list[dict[str, Any]]) -> None:
        repair_tail(self.path)  # Rule 5: never append after a torn line
        _write(self.path, lines_of(records), "a")

    def _clear(self) -> None:
        self.pending.unlink()
        _fsync_dir(self.pending)

    async def recover(self, executions: Any, now: Optional[float] = None) -> int:
        now = None if now is None else require_time("now", now)  # a lease's clock: never a string or NaN
        repair_tail(self.path)
        if not self.pending.exists():
            return 0
        # a torn journal line was never followed by a delete (Rule 2): its document is still
        # stored, so reading only the whole lines loses nothing
        journal = read_jsonl(self.pending).records
        states = await journal_states(executions, [document_of(r) for r in journal], _now(now)) if journal else []
        have = self.read().keys() if "gone" in states else set()
        late = [r for r, state in zip(journal, states) if state == "gone" and r["_id"] not in have]
        if late:
            self._append(late)
        kept = [r for r, state in zip(journal, states) if state == "held"]
        if kept:
            _write(self.pending, lines_of(kept), "w")
        else:
            self._clear()
        return len(late)

    async def begin(self, docs: list[dict[str, Any]]) -> None:
        now = self.clock()
        self._batch = {d["_id"]: removal_record(d, now) for d in docs}
        _write(self.pending, lines_of(list(self._batch.values())), "w")

    async def finish(self, removed: list[dict[str, Any]]) -> None:
        if removed:
            self._append([self._batch[d["_id"]] for d in removed])
        self._batch = {}
        self._clear()


class CollectionArchive:
    """Removals copied into a collection of the same database, one document per removal: the
    record of Rule 1, its `_id` the removal key, the execution's own document (`_id` kept, so
    copying it back restores it) under `document`. Through the journal `<NAME>_pending`."""

    def __init__(self, db: Any, name: str, clock: Callable[[], float] = time.time) -> None:
        name = require_str("name", name)
        self.coll = db[name]
        self.journal = db[name + "_pending"]
        self.clock = clock
        self._batch: dict[str, dict[str, Any]] = {}

    async def read(self, execution_id: str | None = None) -> ArchiveContents:
        """What the archive holds (of one execution, if named), in the order of removal."""
        query = {} if execution_id is None else {"execution_id": require_str("execution_id", execution_id)}
        records = await self.coll.find(query).sort([("pruned_at", ASCENDING), ("_id", ASCENDING)]).to_list(None)
        return ArchiveContents(records=records)

    async def _log(self, records: list[dict[str, Any]]) -> None:
        if records:
            await self.journal.insert_many(records, ordered=False)

    async def _copy(self, records: list[dict[str, Any]]) -> None:
        if records:  # replace by removal key: copying a record twice leaves one copy
            await self.coll.bulk_write([ReplaceOne({"_id": r["_id"]}, r, upsert=True) for r in records], ordered=False)

    async def recover(self, executions: Any, now: Optional[float] = None) -> int:
        now = None if now is None else require_time("now", now)  # a lease's clock: never a string or NaN
        # at the start of every run, so that an archive made before the index gets it
        await self.coll.create_index([("execution_id", ASCENDING), ("pruned_at", ASCENDING)], name=EXECUTION_INDEX)
        journal = await self.journal.find({}).to_list(None)
        if not journal:
            return 0
        states = await journal_states(executions, [document_of(r) for r in journal], _now(now))
        keys = [r["_id"] for r, state in zip(journal, states) if state == "gone"]
        have = {d["_id"] for d in await self.coll.find({"_id": {"$in": keys}}, {"_id": 1}).to_list(None)}
        late = [r for r, state in zip(journal, states) if state == "gone" and r["_id"] not in have]
        await self._copy(late)
        settled = [r["_id"] for r, state in zip(journal, states) if state != "held"]
        await self.journal.delete_many({"_id": {"$in": settled}})
        return len(late)

    async def begin(self, docs: list[dict[str, Any]]) -> None:
        now = self.clock()
        self._batch = {d["_id"]: removal_record(d, now) for d in docs}
        await self._log(list(self._batch.values()))

    async def finish(self, removed: list[dict[str, Any]]) -> None:
        await self._copy([self._batch[d["_id"]] for d in removed])
        await self.journal.delete_many({"_id": {"$in": [r["_id"] for r in self._batch.values()]}})
        self._batch = {}
