"""Layout version 2: the pending-work indexes become partial (see harel_beanie.migrate).

Run with Beanie's CLI, naming the collection prefix in HAREL_PREFIX (default "harel"):

    HAREL_PREFIX=harel beanie migrate -p migrations -uri "$MONGODB_URL" -db harel --no-use-transaction

or with `harel-beanie migrate up`. No document changes: the step creates the partial indexes,
then drops the full ones they replace (and the reverse on the way down).
"""

from beanie import free_fall_migration

from harel_beanie.migrate import run_beanie_step

VERSION = 2


class Forward:
    @free_fall_migration(document_models=[])
    async def partial_pending_indexes(self, session):  # type: ignore[no-untyped-def]
        await run_beanie_step(VERSION, "up")


class Backward:
    @free_fall_migration(document_models=[])
    async def full_pending_indexes(self, session):  # type: ignore[no-untyped-def]
        await run_beanie_step(VERSION, "down")
