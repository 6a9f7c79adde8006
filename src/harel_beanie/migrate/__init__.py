"""Layout migrations: adopt a database harel's MongoStore wrote, and evolve this store's layout.

The pieces, each in a module of its own:

- `engine`: the `Migrator` that runs steps safely with no transactions (batches, a progress
  record to resume from, writes guarded on each document's version, the version checks);
- one module per step (`adopt_harel_mongostore`: version 1 over harel's layout;
  `pending_flag`: 2; `partitions`: 3), listed in `steps.STEPS`;
- the command that runs them, `harel-beanie migrate up|down|status`, is
  `harel_beanie.commands.migrate`, with the same `--url`/`--db`/`--prefix` rules as every command.

Beanie's CLI runs the same steps: each file in `beanie_migrations/` (shipped in the package,
so a pip user has them: `BEANIE_MIGRATIONS` is its path; `migrations/` at the top of the
repository links to it) is a Beanie migration whose `Forward` / `Backward` call
`run_beanie_step` for its version (the prefix comes from `HAREL_PREFIX`, since Beanie's CLI
has no option for it).
"""

from __future__ import annotations

from pathlib import Path

from harel_beanie.migrate.adopt_harel_mongostore import ADDED_FIELDS
from harel_beanie.migrate.engine import (
    BATCH_SIZE,
    PROGRESS_ID,
    LayoutStatus,
    MigrationError,
    Migrator,
    Step,
    StepReport,
    run_beanie_step,
)
from harel_beanie.migrate.steps import STEPS

#: the folder of Beanie migrations to give Beanie's CLI: `beanie migrate -p <it> ...`
BEANIE_MIGRATIONS = Path(__file__).parent / "beanie_migrations"

__all__ = [
    "ADDED_FIELDS",
    "BEANIE_MIGRATIONS",
    "BATCH_SIZE",
    "LayoutStatus",
    "MigrationError",
    "Migrator",
    "PROGRESS_ID",
    "STEPS",
    "Step",
    "StepReport",
    "run_beanie_step",
]
