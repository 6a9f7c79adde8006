"""What a layout step is, and what it sees of the migrator that runs it.

Why this module exists: each step (one module each, listed in `harel_beanie.migrate.steps`)
and the engine that runs them (`harel_beanie.migrate.engine`) both need these; with them here,
a step never imports the engine, and the engine finds the steps without a circle.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Optional, Protocol

UP, DOWN = "up", "down"


class MigrationError(RuntimeError):
    """A migration refused to run, or could not finish; the message says what to do."""


class Migration(Protocol):
    """What a step uses of the `Migrator` running it: the two collections, where they are,
    the prefix (a step reaches other collections of the same prefix through the executions'
    database), the batch size, the clock, and the guarded write every step writes with."""

    exes: Any
    counters: Any
    where: str
    prefix: str
    batch_size: int
    clock_ms: Callable[[], int]

    async def write_guarded(
        self,
        docs: list[dict[str, Any]],
        plan: Callable[[dict[str, Any]], Optional[dict[str, Any]]],
        projection: dict[str, Any],
        before: Optional[Callable[[list[dict[str, Any]]], Awaitable[None]]] = None,
    ) -> int: ...


class Step:
    """One layout change, written as a module of its own (see `harel_beanie.migrate.steps`):
    what it reads of each execution, how it converts a batch each way, and what it does
    before and after the whole pass."""

    version: int
    name: str  # the Beanie migration file in migrations/ that runs it
    up_projection: dict[str, Any]
    down_projection: dict[str, Any]
    #: whether the step converts documents: one that only changes indexes reads none
    documents: bool = True

    async def before_up(self, m: Migration) -> None: ...
    async def after_up(self, m: Migration) -> None: ...
    async def before_down(self, m: Migration) -> None: ...
    async def after_down(self, m: Migration) -> None: ...

    async def up_batch(self, m: Migration, docs: list[dict[str, Any]]) -> int:
        raise NotImplementedError

    async def down_batch(self, m: Migration, docs: list[dict[str, Any]]) -> int:
        raise NotImplementedError
