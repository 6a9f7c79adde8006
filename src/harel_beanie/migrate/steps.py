"""Every layout step this package has, by the layout version it brings a database to.

Each step is a module of its own, as Beanie keeps one file per migration; the Beanie
migration file of the same name in `migrations/` runs it under Beanie's CLI. A new layout
version adds its module here, its file in `migrations/`, and raises `SCHEMA_VERSION`.
"""

from __future__ import annotations

from harel_beanie.core.documents import SCHEMA_VERSION
from harel_beanie.migrate.adopt_harel_mongostore import AdoptHarelLayout
from harel_beanie.migrate.lean_indexes import LeanIndexes
from harel_beanie.migrate.partitions import Partitions
from harel_beanie.migrate.pending_flag import PendingFlag
from harel_beanie.migrate.step import Step

STEPS: dict[int, Step] = {s.version: s for s in (AdoptHarelLayout(), PendingFlag(), Partitions(), LeanIndexes())}
assert sorted(STEPS) == list(range(1, SCHEMA_VERSION + 1)), "one step per layout version"
