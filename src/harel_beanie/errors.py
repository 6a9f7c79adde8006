"""The errors this store raises beyond harel's own `StoreConflict`."""

from __future__ import annotations


class ExecutionTooLarge(ValueError):
    """A commit would make the execution's document exceed MongoDB's document size limit.
    Nothing was written: the stored execution is as it was before the commit."""

    def __init__(self, execution_id: str, size: int, limit: int) -> None:
        super().__init__(
            f"execution {execution_id!r} is too large to store: about {size:,} bytes, "
            f"over the {limit:,}-byte MongoDB document limit; the stored copy is unchanged"
        )
        self.execution_id = execution_id
        self.size = size
        self.limit = limit


class SchemaMismatch(RuntimeError):
    """The database's recorded layout is not the one this version of the store uses."""

    def __init__(self, found: int, expected: int, where: str) -> None:
        if found < expected:
            hint = f"run `harel-beanie migrate up` against {where} to bring it to version {expected}"
        else:
            hint = f"it was written by a newer harel-beanie (layout {found}); upgrade this package"
        super().__init__(f"database layout is version {found}, this store needs {expected}: {hint}")
        self.found = found
        self.expected = expected


class StoreUnavailable(ConnectionError):
    """`from_url` could not reach the server within its retries."""
