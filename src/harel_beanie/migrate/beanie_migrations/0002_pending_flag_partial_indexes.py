"""Layout version 2: the `pending` flag and partial pending-work indexes (see harel_beanie.migrate).

Run with Beanie's CLI, naming the collection prefix in HAREL_PREFIX (default "harel"):

    HAREL_PREFIX=harel beanie migrate -p migrations -uri "$MONGODB_URL" -db harel --no-use-transaction

or with `harel-beanie migrate up`. The step flags the documents holding outbox entries or
spawns, in batches (HAREL_MIGRATE_BATCH_SIZE), then creates the partial indexes and drops the
full ones they replace; on the way down, the reverse.
"""

from beanie import free_fall_migration

from harel_beanie.migrate import run_beanie_step

VERSION = 2


class Forward:
    @free_fall_migration(document_models=[])
    async def pending_flag_partial_indexes(self, session):  # type: ignore[no-untyped-def]
        await run_beanie_step(VERSION, "up")


class Backward:
    @free_fall_migration(document_models=[])
    async def no_pending_flag_full_indexes(self, session):  # type: ignore[no-untyped-def]
        await run_beanie_step(VERSION, "down")
