"""Layout version 3: the partition of every document (see harel_beanie.migrate.partitions).

Run with Beanie's CLI, naming the collection prefix in HAREL_PREFIX (default "harel"):

    HAREL_PREFIX=harel beanie migrate -p migrations -uri "$MONGODB_URL" -db harel --no-use-transaction

or with `harel-beanie migrate up`. It may run while workers of this version run. The step
records the count of partitions in the schema marker, creates the indexes led by `part`, and
writes `part` on every execution, in batches (HAREL_MIGRATE_BATCH_SIZE), then on the queue
and overflow documents; on the way down, it removes `part` and those indexes.
"""

from beanie import free_fall_migration

from harel_beanie.migrate import run_beanie_step

VERSION = 3


class Forward:
    @free_fall_migration(document_models=[])
    async def partitions(self, session):  # type: ignore[no-untyped-def]
        await run_beanie_step(VERSION, "up")


class Backward:
    @free_fall_migration(document_models=[])
    async def no_partitions(self, session):  # type: ignore[no-untyped-def]
        await run_beanie_step(VERSION, "down")
