"""The migration engine: runs layout steps against one database and prefix, safely, with
no transactions (a standalone server has none).

The layout a database holds is recorded in its counters collection (`documents.SCHEMA_MARKER_ID`,
field `n`); no record means version 0, harel's own MongoStore layout. Each step (one module
each, listed in `harel_beanie.migrate.steps`) moves a database one version up or down; this
module knows nothing of what a step changes, only how a step is run:

- it reads the executions through one cursor in `_id` order, `batch_size` documents a round
  trip, and hands them to the step a batch at a time, so memory holds a batch or two,
  never the collection; a cursor the server drops is opened again after the last batch;
- a step writes each document with `Migrator.write_guarded`: one conditional update guarded
  on the `version` it was read at, so a concurrent commit is never overwritten with stale
  values: a document that moved is read again and re-planned;
- a step computes every field from the document itself (or harel's counters), and writes
  only what differs, so running it again changes nothing (idempotent);
- the `_id` of the last finished batch is recorded (`PROGRESS_ID` in the counters
  collection); a step interrupted half-way resumes from there when run again, and the
  recorded layout version changes only once the whole step has finished (up), or before it
  starts (down), so a store never trusts a half-converted database to be at the higher
  version;
- the version checks: a step runs only from the version below it (up) or its own (down),
  never while another step is half-way, never on a database newer than this package.

`run_beanie_step` is what the Beanie migration files in `migrations/` call; the command line
is `harel_beanie.commands.migrate`.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Optional

from harel.engine.schema import DEFAULT_PREFIX, Names
from pymongo import UpdateOne
from pymongo.errors import CursorNotFound

from harel_beanie.core.arguments import require_choice, require_int
from harel_beanie.core.documents import SCHEMA_MARKER_ID, SCHEMA_VERSION, ExecutionDocument, index_models
from harel_beanie.migrate.counts_build import build_counts
from harel_beanie.migrate.step import DOWN, UP, MigrationError, Step
from harel_beanie.store.settings import DEFAULT_WRITE_CONCERN

log = logging.getLogger("harel_beanie.migrate")

#: Documents read and written per batch by default.
BATCH_SIZE = 500
#: The counters-collection document recording a step in progress and its last finished batch.
PROGRESS_ID = "harel_beanie:migration"
#: The environment variable the Beanie migration files read the batch size from (the prefix
#: comes from `HAREL_PREFIX`, as for every command: see `harel_beanie.deploy.where`).
BATCH_ENV = "HAREL_MIGRATE_BATCH_SIZE"
#: How many times a batch re-reads documents a concurrent writer moved before giving up.
GUARD_ATTEMPTS = 5
#: How many times a step opens a new cursor after the server dropped one.
CURSOR_REOPENS = 10


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
    in_progress_name: Optional[str] = None  # that step's name

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
            name = self.in_progress_name or f"step {p.get('step')}"
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
    recorded; a test raises from it to interrupt a step. `say` receives one line per step.
    `steps` defaults to every step this package has (`harel_beanie.migrate.steps.STEPS`)."""

    def __init__(
        self,
        db: Any,
        prefix: str = DEFAULT_PREFIX,
        *,
        batch_size: int = BATCH_SIZE,
        on_batch: Optional[Callable[[int, str, int], None]] = None,
        say: Callable[[str], None] = log.info,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        steps: Optional[Mapping[int, Step]] = None,
    ) -> None:
        batch_size = require_int("batch_size", batch_size, low=1, high=2**31 - 1)
        names = Names(prefix)  # refuses a prefix harel would refuse
        self.prefix = prefix
        self.where = f"database {db.name!r}, prefix {prefix!r}"
        self.exes = db.get_collection(names.executions, write_concern=DEFAULT_WRITE_CONCERN)
        self.counters = db.get_collection(names.counters, write_concern=DEFAULT_WRITE_CONCERN)
        self.batch_size = batch_size
        self.on_batch = on_batch
        self.say = say
        self.clock_ms = clock_ms
        if steps is None:
            from harel_beanie.migrate.steps import STEPS

            steps = STEPS
        self.steps: Mapping[int, Step] = steps

    # --- state ------------------------------------------------------------------------------

    async def status(self) -> LayoutStatus:
        marker = await self.counters.find_one({"_id": SCHEMA_MARKER_ID})
        progress = await self.counters.find_one({"_id": PROGRESS_ID})
        count = await self.exes.estimated_document_count()
        step = self.steps.get(int(progress.get("step", 0))) if progress is not None else None
        return LayoutStatus(
            version=int(marker.get("n") or 0) if marker is not None else 0,
            recorded=marker is not None,
            executions=int(count),
            in_progress=progress,
            in_progress_name=step.name if step is not None else None,
        )

    # --- whole runs -------------------------------------------------------------------------

    async def up(self, to: int = SCHEMA_VERSION) -> list[StepReport]:
        """Every step up to version `to` (default: the version this package needs); at this
        package's version, the counts' counters built last (`migrate.counts_build`)."""
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
        reports = [await self.run_step(v, UP) for v in range(first, to + 1)]
        if to == SCHEMA_VERSION:
            # every index this version declares, also on a database already at it: an index
            # added without a layout change (the oldest holders') reaches a deployment whose
            # stores never create indexes (`create_schema=False`) here; `createIndexes` leaves
            # one that exists as it is. `down` keeps them: an earlier release never names them
            await self.exes.create_indexes(index_models(ExecutionDocument))
            # the counts built here, not inside the first request that reads them
            await build_counts(self.exes, self.counters, self.prefix, self.say)
        return reports

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
        (down) has not run, or another step is half-way. Kept whole: the checks, the progress
        record and the batches are the one protocol a resumed run follows, top to bottom."""
        version = require_int("version", version)  # a bool, a float or a str is not a version
        direction = require_choice("direction", direction, (UP, DOWN))
        step = self.steps.get(version)
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

        # a step that changes only indexes reads none (a pass of a million documents for nothing)
        if step.documents:
            await self._every_document(after, projection, done)
        if direction == UP:
            await step.after_up(self)
        else:
            await step.after_down(self)
        await self.counters.delete_one({"_id": PROGRESS_ID})
        self.say(report.line())
        return report

    async def _every_document(
        self,
        after: Any,
        projection: Optional[dict[str, Any]],
        done: Callable[[list[dict[str, Any]]], Awaitable[Any]],
    ) -> None:
        """Every document after `after`, handed to `done` a batch at a time (it returns the
        batch's last `_id`): one cursor in `_id` order, `batch_size` documents a round trip;
        a server that drops it (an idle timeout) gets a new one from the last batch written."""
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
                return
            except CursorNotFound:
                continue
            finally:
                await cursor.close()
        raise MigrationError(f"the server kept dropping the migration's cursor on {self.where}; run it again")

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
    require_int("to", to)  # a bool, a float or a str is not a version
    if not 0 <= to <= SCHEMA_VERSION:
        raise MigrationError(f"target layout version must be between 0 and {SCHEMA_VERSION}, got {to}")


# --- Beanie's CLI ---------------------------------------------------------------------------


async def run_beanie_step(version: int, direction: str) -> StepReport:
    """What a file in migrations/ runs under `beanie migrate`: step `version` on the
    database Beanie's CLI connected to, for the prefix in `HAREL_PREFIX` (default `harel`:
    Beanie's CLI has no option for it)."""
    from beanie.migrations.database import DBHandler

    from harel_beanie.core.errors import ConfigError
    from harel_beanie.deploy.where import prefix_from

    version = require_int("version", version)  # checked before the database is looked for
    direction = require_choice("direction", direction, (UP, DOWN))
    db = DBHandler.get_db()
    if db is None:
        raise MigrationError("Beanie's migration runner has no database")
    try:
        prefix = prefix_from(None, os.environ)
        m = Migrator(db, prefix, batch_size=int(os.environ.get(BATCH_ENV) or BATCH_SIZE))
    except ConfigError as err:
        raise MigrationError(str(err)) from None
    except ValueError as err:
        raise MigrationError(f"{BATCH_ENV}={os.environ.get(BATCH_ENV)!r}: {err}") from None
    return await m.run_step(version, direction)
