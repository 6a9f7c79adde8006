"""Layout migrations: adopt a database harel's MongoStore wrote, and evolve this store's layout.

The layout a database holds is recorded in its counters collection (`documents.SCHEMA_MARKER_ID`,
field `n`); no record means version 0, harel's own MongoStore layout. Each step below moves a
database one version up or down. Steps are written once, here, and run two ways:

- `harel-beanie migrate up|down|status --url ... --db ... --prefix ...` (`main` below);
- Beanie's CLI, `beanie migrate -p migrations ...`: each file in `migrations/` is a Beanie
  migration whose `Forward` / `Backward` call `run_beanie_step` for its version (the prefix
  comes from the `HAREL_PREFIX` environment variable, since Beanie's CLI has no option for it).

How a step stays safe without transactions (a standalone server has none):

- it reads the executions through one cursor in `_id` order, `batch_size` documents a round
  trip, and converts and writes them a batch at a time, so memory holds a batch or two,
  never the collection;
- each document is rewritten by one conditional update guarded on the `version` it was read
  at, so a concurrent commit is never overwritten with stale values: a document that moved
  is read again and re-planned;
- a step computes every field from the document itself (or harel's counters), and writes
  only what differs, so running it again changes nothing (idempotent);
- the `_id` of the last finished batch is recorded (`PROGRESS_ID` in the counters
  collection); a step interrupted half-way resumes from there when run again, and the
  recorded layout version changes only once the whole step has finished (up), or before it
  starts (down), so a store never trusts a half-converted database to be at the higher
  version.

Version 1 (step `0001_adopt_harel_mongostore`) over harel's layout:

- up: backfills what this store adds to an execution's document (the summary fields copied
  from `data`, `next_fire`, `trace_n`, `seq_hi`), moves harel's per-execution trace counters
  into `trace_n`, creates the indexes, checks that no seq this store can mint reaches harel's
  outbox/spawn counters, and records version 1. Spawn contexts and trace steps stay in
  harel's forms: this store reads both.
- down: converts what harel's store cannot read back to its forms (spawn contexts as
  dicts, trace steps as dicts with their index, harel's timer keys), raises harel's
  outbox/spawn counters to at least every pending seq (so harel hands out larger, unique
  seqs) and its trace counters to each `trace_n`, removes the added fields; the recorded
  version and the indexes go first.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Optional, Sequence

from harel.engine.execution import Execution
from harel.engine.schema import DEFAULT_PREFIX, Names
from pydantic import ValidationError
from pymongo import DeleteOne, UpdateOne
from pymongo.errors import ConfigurationError, CursorNotFound, InvalidURI, PyMongoError

from harel_beanie import records
from harel_beanie.commit import summary_fields
from harel_beanie.connect import mask_url
from harel_beanie.documents import LAYOUT_1_INDEXES, SCHEMA_MARKER_ID, SCHEMA_VERSION, ExecutionDocument, index_models
from harel_beanie.keys import decode_path
from harel_beanie.seqs import EPOCH_MS, NODE_BITS, SEQ_BITS
from harel_beanie.settings import DEFAULT_WRITE_CONCERN

log = logging.getLogger("harel_beanie.migrate")

#: Documents read and written per batch by default.
BATCH_SIZE = 500
#: The counters-collection document recording a step in progress and its last finished batch.
PROGRESS_ID = "harel_beanie:migration"
#: The environment variables the Beanie migration files read.
PREFIX_ENV = "HAREL_PREFIX"
BATCH_ENV = "HAREL_MIGRATE_BATCH_SIZE"
#: How many times a batch re-reads documents a concurrent writer moved before giving up.
GUARD_ATTEMPTS = 5
#: How many times a step opens a new cursor after the server dropped one.
CURSOR_REOPENS = 10

UP, DOWN = "up", "down"

# harel's MongoStore: its seq counters, its per-execution trace counter, its timer-key dot
_HAREL_SEQ_COUNTERS = {"outbox": "outbox", "spawns": "spawn"}
_HAREL_TRACE_COUNTER = "trace:"
_HAREL_DOT = "\uff0e"

#: The fields version 1 adds to an execution's document.
ADDED_FIELDS = (
    "status",
    "outcome",
    "active_path",
    "parent_id",
    "created_at",
    "updated_at",
    "finished_at",
    "finished_on",
    "next_fire",
    "trace_n",
    "seq_hi",
    "commit_token",  # written by releases before the token ring
    "commit_tokens",
    "born",
    "buried",
)


class MigrationError(RuntimeError):
    """A migration refused to run, or could not finish; the message says what to do."""


@dataclass
class StepReport:
    """What one run of one step did."""

    version: int
    direction: str
    name: str
    batches: int = 0
    read: int = 0
    updated: int = 0
    resumed_after: Optional[str] = None
    skipped: bool = False  # the database was already past this step

    def line(self) -> str:
        if self.skipped:
            return f"{self.name} {self.direction}: nothing to do"
        resumed = f", resumed after _id {self.resumed_after!r}" if self.resumed_after is not None else ""
        return (
            f"{self.name} {self.direction}: {self.read} executions read in {self.batches} batches, "
            f"{self.updated} updated{resumed}"
        )


@dataclass
class LayoutStatus:
    version: int  # recorded, or 0 (harel's layout, or an empty database)
    recorded: bool  # a version record exists
    executions: int  # an estimate (the collection's count)
    in_progress: Optional[dict[str, Any]] = None  # the step interrupted, if any

    def lines(self, where: str) -> list[str]:
        if self.recorded:
            layout = f"layout version {self.version}"
        elif self.executions:
            layout = "layout version 0 (harel's MongoStore layout, not migrated)"
        else:
            layout = "no layout recorded (an empty database)"
        out = [f"{where}: {layout}; this harel-beanie needs version {SCHEMA_VERSION}"]
        out.append(f"executions: about {self.executions}")
        if self.in_progress is not None:
            p = self.in_progress
            step = STEPS.get(int(p.get("step", 0)))
            name = step.name if step else f"step {p.get('step')}"
            out.append(
                f"interrupted: {name} {p.get('direction')}, finished up to _id {p.get('after')!r}; "
                f"run `harel-beanie migrate {p.get('direction')}` again to finish it"
            )
        elif self.version < SCHEMA_VERSION:
            out.append("pending: run `harel-beanie migrate up`")
        elif self.version > SCHEMA_VERSION:
            out.append("this database is newer than this harel-beanie: upgrade the package")
        else:
            out.append("up to date")
        return out


# --- the migrator ---------------------------------------------------------------------------


class Migrator:
    """Runs the steps against one database and prefix (PyMongo's async API).

    `on_batch(version, direction, batches_done)` is called after each batch is written and
    recorded; a test raises from it to interrupt a step. `say` receives one line per step."""

    def __init__(
        self,
        db: Any,
        prefix: str = DEFAULT_PREFIX,
        *,
        batch_size: int = BATCH_SIZE,
        on_batch: Optional[Callable[[int, str, int], None]] = None,
        say: Callable[[str], None] = log.info,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        names = Names(prefix)  # refuses a prefix harel would refuse
        self.prefix = prefix
        self.where = f"database {db.name!r}, prefix {prefix!r}"
        # `bind(prefix)` differs from the default classes only in the collection names
        self.indexes = index_models(ExecutionDocument)
        self.exes = db.get_collection(names.executions, write_concern=DEFAULT_WRITE_CONCERN)
        self.counters = db.get_collection(names.counters, write_concern=DEFAULT_WRITE_CONCERN)
        self.batch_size = batch_size
        self.on_batch = on_batch
        self.say = say
        self.clock_ms = clock_ms

    # --- state ------------------------------------------------------------------------------

    async def status(self) -> LayoutStatus:
        marker = await self.counters.find_one({"_id": SCHEMA_MARKER_ID})
        progress = await self.counters.find_one({"_id": PROGRESS_ID})
        count = await self.exes.estimated_document_count()
        return LayoutStatus(
            version=int(marker.get("n") or 0) if marker is not None else 0,
            recorded=marker is not None,
            executions=int(count),
            in_progress=progress,
        )

    # --- whole runs -------------------------------------------------------------------------

    async def up(self, to: int = SCHEMA_VERSION) -> list[StepReport]:
        """Every step up to version `to` (default: the version this package needs)."""
        st = await self.status()
        _check_target(to)
        self._refuse_newer(st)
        if to < st.version:
            raise MigrationError(f"{self.where} is at layout version {st.version}, above {to}: that is `down`")
        if st.in_progress is not None:
            first = int(st.in_progress["step"])
            if first > to:
                raise MigrationError(self._other_in_progress(st.in_progress))
        else:
            first = st.version + 1
        return [await self.run_step(v, UP) for v in range(first, to + 1)]

    async def down(self, to: Optional[int] = None) -> list[StepReport]:
        """Every step down to version `to` (default: one step down; 0 is harel's layout)."""
        st = await self.status()
        self._refuse_newer(st)
        if st.in_progress is not None:
            top = int(st.in_progress["step"])
            to = top - 1 if to is None else to
            if top <= to:
                raise MigrationError(self._other_in_progress(st.in_progress))
        else:
            top = st.version
            to = max(top - 1, 0) if to is None else to
        _check_target(to)
        if to > top:
            raise MigrationError(f"{self.where} is at layout version {top}, below {to}: that is `up`")
        return [await self.run_step(v, DOWN) for v in range(top, to, -1)]

    # --- one step ---------------------------------------------------------------------------

    async def run_step(self, version: int, direction: str) -> StepReport:
        """Run step `version` in `direction`, resuming it if it was interrupted. A no-op when
        the database is already past it; refused when an earlier step (up) or a later one
        (down) has not run, or another step is half-way."""
        if direction not in (UP, DOWN):
            raise ValueError(f"direction must be {UP!r} or {DOWN!r}, got {direction!r}")
        step = STEPS.get(version)
        if step is None:
            raise MigrationError(f"there is no migration to layout version {version} (known: 1..{SCHEMA_VERSION})")
        st = await self.status()
        self._refuse_newer(st)
        report = StepReport(version, direction, step.name)
        progress = st.in_progress
        if progress is not None and int(progress.get("step", -1)) != version:
            raise MigrationError(self._other_in_progress(progress))
        if progress is None:
            if direction == UP and st.version >= version or direction == DOWN and st.version < version:
                report.skipped = True
                self.say(report.line())
                return report
            if direction == UP and st.version != version - 1:
                raise MigrationError(f"{self.where} is at layout version {st.version}: run the earlier steps first")
            if direction == DOWN and st.version != version:
                raise MigrationError(f"{self.where} is at layout version {st.version}: run the later steps down first")

        after = progress.get("after") if progress is not None and progress.get("direction") == direction else None
        report.resumed_after = after
        if after is None:
            # recorded before anything changes, so an interrupted step is always seen
            await self.counters.replace_one(
                {"_id": PROGRESS_ID},
                {"step": version, "direction": direction, "after": None, "started_ms": self.clock_ms()},
                upsert=True,
            )
        if direction == UP:
            await step.before_up(self)
        else:
            await step.before_down(self)
        projection = step.up_projection if direction == UP else step.down_projection
        convert = step.up_batch if direction == UP else step.down_batch

        async def done(batch: list[dict[str, Any]]) -> Any:
            report.updated += await convert(self, batch)
            report.read += len(batch)
            report.batches += 1
            last = batch[-1]["_id"]
            await self.counters.update_one({"_id": PROGRESS_ID}, {"$set": {"after": last}})
            if self.on_batch is not None:
                self.on_batch(version, direction, report.batches)
            return last

        # one cursor in `_id` order, `batch_size` documents a round trip; a server that drops
        # it (an idle timeout) gets a new one from the last batch written
        for _ in range(CURSOR_REOPENS):
            query = {} if after is None else {"_id": {"$gt": after}}
            cursor = self.exes.find(query, projection).sort("_id", 1).batch_size(self.batch_size)
            try:
                batch: list[dict[str, Any]] = []
                async for doc in cursor:
                    batch.append(doc)
                    if len(batch) == self.batch_size:
                        after, batch = await done(batch), []
                if batch:
                    after = await done(batch)
                break
            except CursorNotFound:
                continue
            finally:
                await cursor.close()
        else:
            raise MigrationError(f"the server kept dropping the migration's cursor on {self.where}; run it again")
        if direction == UP:
            await step.after_up(self)
        else:
            await step.after_down(self)
        await self.counters.delete_one({"_id": PROGRESS_ID})
        self.say(report.line())
        return report

    # --- helpers for the steps --------------------------------------------------------------

    async def write_guarded(
        self,
        docs: list[dict[str, Any]],
        plan: Callable[[dict[str, Any]], Optional[dict[str, Any]]],
        projection: dict[str, Any],
        before: Optional[Callable[[list[dict[str, Any]]], Awaitable[None]]] = None,
    ) -> int:
        """Write `plan(doc)` to each document (None: nothing to change), each guarded on the
        version it was read at; documents a concurrent writer moved are read again and
        re-planned. `before(docs)` runs ahead of each round of writes. Returns how many
        documents were updated."""
        updated = 0
        for _ in range(GUARD_ATTEMPTS):
            if before is not None:
                await before(docs)
            ops, read_at = [], {}
            for doc in docs:
                update = plan(doc)
                if update:
                    ops.append(UpdateOne({"_id": doc["_id"], "version": doc.get("version")}, update))
                    read_at[doc["_id"]] = doc.get("version")
            if not ops:
                return updated
            result = await self.exes.bulk_write(ops, ordered=False)
            updated += result.matched_count
            if result.matched_count == len(ops):
                return updated
            fresh = await self.exes.find({"_id": {"$in": list(read_at)}}, projection).to_list(None)
            docs = [d for d in fresh if d.get("version") != read_at[d["_id"]]]
        raise MigrationError(
            f"executions in {self.where} kept changing during the migration: stop every worker "
            "on this database, then run the migration again (it resumes)"
        )

    def mint_floor(self) -> int:
        """The smallest seq this store can mint from now on (see `harel_beanie.seqs`)."""
        return (self.clock_ms() - EPOCH_MS) << (NODE_BITS + SEQ_BITS)

    def _refuse_newer(self, st: LayoutStatus) -> None:
        if st.version > SCHEMA_VERSION:
            raise MigrationError(
                f"{self.where} is at layout version {st.version}, newer than this harel-beanie "
                f"knows ({SCHEMA_VERSION}): migrate it with the newer package"
            )

    def _other_in_progress(self, progress: dict[str, Any]) -> str:
        return (
            f"{self.where} has step {progress.get('step')} {progress.get('direction')} half-way: "
            f"run `harel-beanie migrate {progress.get('direction')}` to finish it first"
        )


def _check_target(to: int) -> None:
    if not 0 <= to <= SCHEMA_VERSION:
        raise MigrationError(f"target layout version must be between 0 and {SCHEMA_VERSION}, got {to}")


# --- the steps ------------------------------------------------------------------------------


class Step:
    """One layout change; subclasses fill in the batch conversions and the hooks."""

    version: int
    name: str  # the Beanie migration file in migrations/ that runs it
    up_projection: dict[str, Any]
    down_projection: dict[str, Any]

    async def before_up(self, m: Migrator) -> None: ...
    async def after_up(self, m: Migrator) -> None: ...
    async def before_down(self, m: Migrator) -> None: ...
    async def after_down(self, m: Migrator) -> None: ...

    async def up_batch(self, m: Migrator, docs: list[dict[str, Any]]) -> int:
        raise NotImplementedError

    async def down_batch(self, m: Migrator, docs: list[dict[str, Any]]) -> int:
        raise NotImplementedError


class AdoptHarelLayout(Step):
    """Version 1: harel's MongoStore layout (version 0) to this store's."""

    version = 1
    name = "0001_adopt_harel_mongostore"
    # never `processed`: harel's store lets it grow without bound
    up_projection = {
        "version": 1,
        "data": 1,
        "timers": 1,
        "outbox.seq": 1,
        "spawns.seq": 1,
        "trace": 1,
        **{f: 1 for f in ADDED_FIELDS},
    }
    down_projection = {
        "version": 1,
        "timers": 1,
        "outbox.seq": 1,
        "spawns": 1,
        "trace": 1,
        **{f: 1 for f in ADDED_FIELDS},
    }

    # --- up ---------------------------------------------------------------------------------

    async def before_up(self, m: Migrator) -> None:
        # this store's seqs start above every value harel's counters handed out; check it,
        # rather than trust it (a counter raised by an earlier `down` is near our range)
        floor = m.mint_floor()
        for name in _HAREL_SEQ_COUNTERS.values():
            c = await m.counters.find_one({"_id": name})
            if c is not None and int(c.get("n") or 0) >= floor:
                raise MigrationError(
                    f"harel's {name!r} counter in {m.where} is at {c['n']}, at or above the seqs "
                    f"this store mints now ({floor}): a seq could collide; is a server clock behind?"
                )

    async def up_batch(self, m: Migrator, docs: list[dict[str, Any]]) -> int:
        ids = [d["_id"] for d in docs]
        trace_counters: dict[str, int] = {}
        if ids:
            found = await m.counters.find({"_id": {"$in": [_HAREL_TRACE_COUNTER + i for i in ids]}}).to_list(None)
            trace_counters = {c["_id"][len(_HAREL_TRACE_COUNTER) :]: int(c.get("n") or 0) for c in found}
        updated = await m.write_guarded(docs, lambda d: adopt_update(d, trace_counters.get(d["_id"])), self.up_projection)
        if trace_counters:
            # folded into `trace_n`; a re-run without them keeps it (`trace_n` only grows)
            await m.counters.bulk_write([DeleteOne({"_id": _HAREL_TRACE_COUNTER + i}) for i in trace_counters], ordered=False)
        return updated

    async def after_up(self, m: Migrator) -> None:
        if m.indexes:
            await m.exes.create_indexes(m.indexes)
        await m.counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": self.version}}, upsert=True)

    # --- down -------------------------------------------------------------------------------

    async def before_down(self, m: Migrator) -> None:
        # no record = version 0, which this store serves in compatibility mode: it reads both
        # layouts, so it stays correct on a half-converted database, and needs none of the
        # indexes (dropped first: every rewrite below would otherwise update them)
        await m.counters.delete_one({"_id": SCHEMA_MARKER_ID})
        await _drop_indexes(m)
        # harel's store reads every document as an execution: purged executions' tombstones
        # (which it has no use for: it deletes on purge) go, and so do the seq leases
        await m.exes.delete_many({"tomb": {"$exists": True}})
        await m.counters.delete_many({"_id": {"$regex": "^harel_beanie:node:"}})

    async def down_batch(self, m: Migrator, docs: list[dict[str, Any]]) -> int:
        async def raise_counters(batch: list[dict[str, Any]]) -> None:
            # before the documents: a re-run after an interruption still sees every seq,
            # which stays pending in its document either way
            for array, counter in _HAREL_SEQ_COUNTERS.items():
                hi = max((e["seq"] for d in batch for e in d.get(array) or ()), default=None)
                if hi is not None:
                    await m.counters.update_one({"_id": counter}, {"$max": {"n": hi}}, upsert=True)
            traced = [UpdateOne({"_id": _HAREL_TRACE_COUNTER + d["_id"]}, {"$max": {"n": int(d["trace_n"])}}, upsert=True)
                      for d in batch if d.get("trace_n")]  # fmt: skip
            if traced:
                await m.counters.bulk_write(traced, ordered=False)

        return await m.write_guarded(docs, restore_update, self.down_projection, before=raise_counters)

    async def after_down(self, m: Migrator) -> None:
        await _drop_indexes(m)  # a store started meanwhile creates them again


async def _drop_indexes(m: Migrator) -> None:
    names = {ix.document["name"] for ix in [*m.indexes, *LAYOUT_1_INDEXES]}
    for name in [ix["name"] async for ix in await m.exes.list_indexes()]:
        if name in names:
            await m.exes.drop_index(name)


def adopt_update(doc: dict[str, Any], trace_counter: Optional[int]) -> Optional[dict[str, Any]]:
    """The update bringing one harel-layout document to version 1 (None: already there)."""
    want: dict[str, Any] = {}
    if doc.get("data") is not None:
        try:
            exe = Execution.model_validate_json(doc["data"])
        except ValidationError as err:
            why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'data'}: {e['msg']}" for e in err.errors()[:3])
            raise MigrationError(f"execution {doc['_id']!r}: its `data` is not an Execution ({why})") from None
        want.update(summary_fields(exe))
    timers = doc.get("timers") or {}
    # steps ever written: harel's counter, or this store's count, or what the ring shows
    want["trace_n"] = max(doc.get("trace_n") or 0, trace_counter or 0, _ring_count(doc.get("trace") or []))
    sets = {k: v for k, v in want.items() if k not in doc or not _same(doc[k], v)}
    unset: dict[str, str] = {}
    # `seq_hi` and `next_fire` are absent, never null, when there is none: `$max`/`$min`
    # keep a null (it sorts below every number)
    seqs = [e["seq"] for array in ("outbox", "spawns") for e in doc.get(array) or ()]
    if isinstance(doc.get("seq_hi"), int):
        seqs.append(doc["seq_hi"])
    for name, value in (("seq_hi", max(seqs, default=None)), ("next_fire", min(timers.values(), default=None))):
        if value is None:
            if name in doc:
                unset[name] = ""
        elif doc.get(name) != value:
            sets[name] = value
    update: dict[str, Any] = {}
    if unset:
        update["$unset"] = unset
    if sets:
        update["$set"] = sets
    return update or None


def _same(stored: Any, wanted: Any) -> bool:
    """Whether a stored value already is the wanted one. A date comes back from the server
    without its time zone (UTC, to the millisecond) unless the client asks for aware ones."""
    if isinstance(stored, datetime) and isinstance(wanted, datetime):
        as_utc = stored if stored.tzinfo else stored.replace(tzinfo=timezone.utc)
        return abs((as_utc - wanted).total_seconds()) < 0.001
    return bool(stored == wanted)


def _ring_count(trace: list[dict[str, Any]]) -> int:
    """The fewest trace steps ever written that the ring can show: past the last step
    harel's store wrote (it holds its index), one for each of this store's steps after it.
    A store in compatibility mode counted only its own steps in `trace_n`; this raises such
    a count past harel's, so the steps keep distinct indexes."""
    count = 0
    for item in trace:
        if _is_harel_step(item) and isinstance(item.get("index"), int):
            count = item["index"] + 1
        else:
            count += 1
    return count


def restore_update(doc: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The update bringing one version-1 document back to harel's layout (None: already)."""
    sets: dict[str, Any] = {}
    spawns = doc.get("spawns") or []
    if any(isinstance(s.get("context"), str) for s in spawns):
        sets["spawns"] = [{**s, "context": records.spawn_context(s["context"])} for s in spawns]
    trace = doc.get("trace") or []
    if any(not _is_harel_step(item) for item in trace):
        sets["trace"] = records.trace_steps(doc)
    timers = doc.get("timers") or {}
    harel_timers = {harel_timer_key(k): at for k, at in timers.items()}
    if list(harel_timers) != list(timers):
        sets["timers"] = harel_timers
    unset = {f: "" for f in ADDED_FIELDS if f in doc}
    update: dict[str, Any] = {}
    if sets:
        update["$set"] = sets
    if unset:
        update["$unset"] = unset
    return update or None


def _is_harel_step(item: dict[str, Any]) -> bool:
    return not (len(item) == 1 and isinstance(item.get("t"), str))


def harel_timer_key(key: str) -> str:
    """The `timers` field name harel's store uses for the path `key` stands for. This store's
    encoding is harel's for every ordinary path; a path harel cannot store (empty, a leading
    `$`, a NUL) keeps this store's key."""
    path = decode_path(key)
    if not path or path.startswith("$") or "\x00" in path:
        return key
    return path.replace(".", _HAREL_DOT)


class PendingFlag(Step):
    """Version 2: documents holding outbox entries or spawns are flagged `pending`, and the
    pending-work indexes become partial: `hb_pending` (the flag: both kinds of entry, one
    relay read) and `hb_timer_pending` replace `documents.LAYOUT_1_INDEXES`. A document
    holding no work then writes no key in them on any commit."""

    version = 2
    name = "0002_pending_flag_partial_indexes"
    up_projection = {"version": 1, "pending": 1, "outbox.seq": 1, "spawns.seq": 1}
    down_projection = {"version": 1, "pending": 1}

    async def up_batch(self, m: Migrator, docs: list[dict[str, Any]]) -> int:
        return await m.write_guarded(docs, pending_update, self.up_projection)

    async def after_up(self, m: Migrator) -> None:
        if m.indexes:
            await m.exes.create_indexes(m.indexes)
        await _drop_named(m, [ix.document["name"] for ix in LAYOUT_1_INDEXES])
        await m.counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": self.version}}, upsert=True)

    async def before_down(self, m: Migrator) -> None:
        # version 1's indexes first: its stores must find their reads index-backed
        await m.exes.create_indexes(LAYOUT_1_INDEXES)
        await _drop_named(m, [ix.document["name"] for ix in m.indexes if "partialFilterExpression" in ix.document])

    async def down_batch(self, m: Migrator, docs: list[dict[str, Any]]) -> int:
        return await m.write_guarded(docs, lambda d: {"$unset": {"pending": ""}} if "pending" in d else None, self.down_projection)

    async def after_down(self, m: Migrator) -> None:
        await m.counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": self.version - 1}}, upsert=True)


def pending_update(doc: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The update setting `pending` as the document's entries say (None: already so)."""
    holds = bool(doc.get("outbox") or doc.get("spawns"))
    if holds and doc.get("pending") is not True:
        return {"$set": {"pending": True}}
    if not holds and "pending" in doc:
        return {"$unset": {"pending": ""}}
    return None


async def _drop_named(m: Migrator, names: list[str]) -> None:
    present = {ix["name"] async for ix in await m.exes.list_indexes()}
    for name in names:
        if name in present:
            await m.exes.drop_index(name)


STEPS: dict[int, Step] = {s.version: s for s in (AdoptHarelLayout(), PendingFlag())}
assert sorted(STEPS) == list(range(1, SCHEMA_VERSION + 1)), "one step per layout version"


# --- Beanie's CLI ---------------------------------------------------------------------------


async def run_beanie_step(version: int, direction: str) -> StepReport:
    """What a file in migrations/ runs under `beanie migrate`: step `version` on the
    database Beanie's CLI connected to, for the prefix in `HAREL_PREFIX` (default `harel`)."""
    from beanie.migrations.database import DBHandler

    db = DBHandler.get_db()
    if db is None:
        raise MigrationError("Beanie's migration runner has no database")
    prefix = os.environ.get(PREFIX_ENV) or DEFAULT_PREFIX
    try:
        batch = int(os.environ.get(BATCH_ENV) or BATCH_SIZE)
        m = Migrator(db, prefix, batch_size=batch)
    except ValueError as err:
        raise MigrationError(f"{PREFIX_ENV}={prefix!r}, {BATCH_ENV}={os.environ.get(BATCH_ENV)!r}: {err}") from None
    return await m.run_step(version, direction)


# --- `harel-beanie migrate` -----------------------------------------------------------------


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, no usage dump
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="harel-beanie migrate",
        description="Move a harel-beanie database between layout versions "
        "(0 is harel's own MongoStore layout). Stop the workers on the database first.",
    )
    p.add_argument("action", choices=("up", "down", "status"), help="up: to this package's layout; "
                   "down: one version back (or --to); status: what the database holds")  # fmt: skip
    p.add_argument("--url", default=os.environ.get("MONGODB_URL"), help="MongoDB URL (default: $MONGODB_URL)")
    p.add_argument("--db", default="harel", help="database name (default: harel)")
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="collection prefix (default: harel)")
    p.add_argument("--to", type=int, default=None, help="target layout version (0 = harel's MongoStore)")
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE, help=f"executions per batch (default {BATCH_SIZE})")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the server (default 10)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`harel-beanie migrate up|down|status`. Exit status: 0 done, 1 the migration refused
    or failed (the message says why; re-running resumes), 2 bad arguments or no server."""
    try:
        args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except _UsageError as err:
        return _fail(str(err), 2)
    except SystemExit as done:  # --help
        return int(done.code or 0)
    if not args.url:
        return _fail("no server given: pass --url or set MONGODB_URL", 2)
    try:
        Names(args.prefix)
    except ValueError as err:
        return _fail(f"--prefix: {err}", 2)
    if not args.db or any(c in args.db for c in '/\\. "$\x00'):
        return _fail(f"--db must be a MongoDB database name, got {args.db!r}", 2)
    if args.batch_size < 1:
        return _fail(f"--batch-size must be at least 1, got {args.batch_size}", 2)
    if args.to is not None and args.action == "status":
        return _fail("--to goes with up or down", 2)
    if args.to is not None and not 0 <= args.to <= SCHEMA_VERSION:
        return _fail(f"--to must be a layout version from 0 to {SCHEMA_VERSION}, got {args.to}", 2)
    if args.timeout <= 0:
        return _fail(f"--timeout must be positive, got {args.timeout}", 2)
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return _fail("interrupted; run the same command again to resume", 130)


async def _main(args: argparse.Namespace) -> int:
    from pymongo import AsyncMongoClient

    where = mask_url(args.url)
    try:
        client: Any = AsyncMongoClient(args.url, serverSelectionTimeoutMS=int(args.timeout * 1000))
    except (InvalidURI, ConfigurationError, ValueError, TypeError) as err:
        return _fail(f"--url {where}: {err}", 2)
    try:
        try:
            await client.admin.command("ping")
        except PyMongoError as err:
            return _fail(f"cannot reach MongoDB at {where} within {args.timeout:g}s: {_first_line(err)}", 2)
        m = Migrator(client[args.db], args.prefix, batch_size=args.batch_size, say=print)
        try:
            if args.action == "status":
                for line in (await m.status()).lines(m.where):
                    print(line)
            elif args.action == "up":
                await m.up(SCHEMA_VERSION if args.to is None else args.to)
                print(f"{m.where}: at layout version {(await m.status()).version}")
            else:
                await m.down(args.to)
                print(f"{m.where}: at layout version {(await m.status()).version}")
        except MigrationError as err:
            return _fail(str(err), 1)

        except PyMongoError as err:
            return _fail(
                f"the server failed during the migration ({type(err).__name__}: {_first_line(err)}); "
                "run the same command again to resume",
                1,
            )
        return 0
    finally:
        await client.close()


def _first_line(err: BaseException) -> str:
    """The driver's message without its timeout settings and topology dump."""
    text = str(err).strip()
    text = text.splitlines()[0] if text else type(err).__name__
    for tail in (" (configured timeouts", ", Timeout:", ", full error:"):
        text = text.split(tail, 1)[0]
    return text


def _fail(message: str, code: int) -> int:
    print(f"harel-beanie migrate: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "BATCH_SIZE",
    "LayoutStatus",
    "MigrationError",
    "Migrator",
    "STEPS",
    "StepReport",
    "main",
    "run_beanie_step",
]
