"""Layout version 4: the executions' indexes without `hb_pending`, whose key was a prefix of
`hb_pending_part`'s under the same partial filter (see harel_beanie.migrate.lean_indexes).

Run with Beanie's CLI, naming the collection prefix in HAREL_PREFIX (default "harel"):

    HAREL_PREFIX=harel beanie migrate -p migrations -uri "$MONGODB_URL" -db harel --no-use-transaction

or with `harel-beanie migrate up`. It may run while workers of this version run. It reads no
document: up drops the index, down creates it again.
"""

from beanie import free_fall_migration

from harel_beanie.migrate import run_beanie_step

VERSION = 4


class Forward:
    @free_fall_migration(document_models=[])
    async def lean_indexes(self, session):  # type: ignore[no-untyped-def]
        await run_beanie_step(VERSION, "up")


class Backward:
    @free_fall_migration(document_models=[])
    async def with_hb_pending(self, session):  # type: ignore[no-untyped-def]
        await run_beanie_step(VERSION, "down")
