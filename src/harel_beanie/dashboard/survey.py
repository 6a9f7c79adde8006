"""What the dashboard found in its database: the store's layout, its indexes, its executions.

Why this module exists: the dashboard may be pointed at a database in any state: one the
store has not written to yet, a mistyped `--db` or `--prefix`, one whose indexes are half
made, one harel's own store wrote (not migrated), one of another layout version. Each page
must still read (empty where there is nothing) and say what it found and what to run, never
answer 500. So before it reads, the dashboard looks (once every `TTL` seconds) at what is
there, and:

- names an index to the server (`hint`) only when every index the reads name exists: a hint
  naming a missing index is an error on the server, where the same read without it is only
  slower;
- takes its per-minute samples (a write) only in a database that holds the store's data, so
  a mistyped `--db` is left as it was found;
- shows a line saying what is missing and the command that makes it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Optional

from pymongo.errors import PyMongoError

from harel_beanie.core.documents import SCHEMA_MARKER_ID, SCHEMA_VERSION, bind, index_models

#: how long one look at the database is trusted (a `migrate up` shows within this)
TTL = 5.0


@dataclass(frozen=True)
class Survey:
    """One look at a database under a prefix."""

    db: str
    prefix: str
    layout: Optional[int]  # the schema marker's version; None: no marker
    has_executions: Optional[bool]  # None: not looked at (a layout marker says the store is here)
    missing: tuple[str, ...]  # the store's indexes on the executions that are not there

    @property
    def hint(self) -> bool:
        """Whether the reads may name their index to the server."""
        return not self.missing

    @property
    def holds_store(self) -> bool:
        """Whether this database holds the store's data (a layout, or executions)."""
        return self.layout is not None or bool(self.has_executions)

    def notice(self) -> Optional[str]:
        """What a page says about the database, or None when it is as the store made it."""
        where = f"database {self.db!r}, prefix {self.prefix!r}"
        migrate = f"`harel-beanie migrate up --db {self.db} --prefix {self.prefix}`"
        if self.layout is not None and self.layout != SCHEMA_VERSION:
            fix = "upgrade harel-beanie" if self.layout > SCHEMA_VERSION else f"run {migrate}"
            return f"{where} is at layout {self.layout}, not this package's {SCHEMA_VERSION}: {fix}"
        if not self.holds_store:
            return (
                f"no harel-beanie schema in {where}: nothing to show yet. Run {migrate}, or start a worker "
                "(`harel-beanie worker`), to create it; if executions were expected here, check --db and --prefix"
            )
        if self.layout is None:
            return (
                f"{where} holds executions in harel's own MongoStore layout: they are shown, read without "
                f"the store's indexes; run {migrate} to migrate them"
            )
        if self.missing:
            return (
                f"{where} lacks the indexes {', '.join(self.missing)}: pages read without them (slowly on a large "
                f"store); run {migrate} to create them"
            )
        return None


async def survey(prefix: str) -> Survey:
    """Look at the store's collections under `prefix` (Beanie initialised on them)."""
    doc, counter = bind(prefix)
    executions = doc.get_pymongo_collection()
    marker = await counter.get_pymongo_collection().find_one({"_id": SCHEMA_MARKER_ID})
    present = {ix["name"] async for ix in await executions.list_indexes()}
    wanted = ["_id_", *(ix.document["name"] for ix in index_models(doc))]
    # without a layout marker, any document (a tombstone too) says harel's store wrote here.
    # With one, the store's data is known to be here, and the read is skipped: a `find_one({})`
    # reads the whole collection on a server whose `limit` bounds nothing (SecantusDB, where
    # it also holds the server's lock, stalling every other read while it runs), and the
    # survey is taken again every `TTL` seconds
    some = None if marker is not None else await executions.find_one({}, {"_id": 1})
    layout = None if marker is None else int(marker.get("n") or 0)
    return Survey(
        executions.database.name,
        prefix,
        layout,
        None if marker is not None else some is not None,
        tuple(name for name in wanted if name not in present),
    )


class Surveyor:
    """The latest look at one database. The first is awaited; after that a look older than
    `ttl` seconds is taken again in the background while the pages go on with the last one,
    so a page's own reads are the same from one request to the next."""

    def __init__(self, ttl: float = TTL, clock: Any = time.monotonic) -> None:
        self.ttl = ttl
        self.clock = clock
        self.latest: Optional[Survey] = None
        self._at = 0.0
        self._again: Optional[asyncio.Task[None]] = None

    async def __call__(self, prefix: str) -> Survey:
        if self.latest is None:
            await self._look(prefix)
        elif self.clock() - self._at >= self.ttl and (self._again is None or self._again.done()):
            self._again = asyncio.get_running_loop().create_task(self._look(prefix))
        assert self.latest is not None
        return self.latest

    async def _look(self, prefix: str) -> None:
        at = self.clock()
        try:
            self.latest = await survey(prefix)
        except PyMongoError:
            if self.latest is None:
                raise  # the first look: the page says what failed
            return  # the last look stands; the next page asks again
        self._at = at
