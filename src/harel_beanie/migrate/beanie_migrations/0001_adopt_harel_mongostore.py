"""Layout version 1: adopt a database harel's MongoStore wrote (see harel_beanie.migrate).

Run with Beanie's CLI, naming the collection prefix in HAREL_PREFIX (default "harel"):

    HAREL_PREFIX=harel beanie migrate -p migrations -uri "$MONGODB_URL" -db harel --no-use-transaction

or with `harel-beanie migrate up`. The step needs no transaction, works in batches
(HAREL_MIGRATE_BATCH_SIZE, default 500) and resumes where it stopped if interrupted.
"""

from beanie import free_fall_migration

from harel_beanie.migrate import run_beanie_step

VERSION = 1


class Forward:
    @free_fall_migration(document_models=[])
    async def adopt_harel_layout(self, session):  # type: ignore[no-untyped-def]
        await run_beanie_step(VERSION, "up")


class Backward:
    @free_fall_migration(document_models=[])
    async def restore_harel_layout(self, session):  # type: ignore[no-untyped-def]
        await run_beanie_step(VERSION, "down")
