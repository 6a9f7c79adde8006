"""The errors this store raises beyond harel's own `StoreConflict` (and `CommitOutcomeUnknown`,
in `harel_beanie.core.outcome`: a driver error, it needs the driver).

Free of the driver, so the command line can name and catch them before it imports one.
"""

from __future__ import annotations

from typing import Optional


class ExecutionTooLarge(ValueError):
    """A commit would make the execution's document exceed MongoDB's document size limit.
    Nothing was written: the stored execution is as it was before the commit.

    `size` is what the document would take (or, refused before sending, what the
    execution's own JSON takes), `limit` what it may take, `parts` the sizes of what it
    holds, largest first in the message, and `reserved` what the store keeps for its own
    trace ring and dedupe window."""

    def __init__(
        self, execution_id: str, size: int, limit: int, *, parts: Optional[dict[str, int]] = None, reserved: int = 0
    ) -> None:
        detail = ", ".join(f"{name} {n:,} bytes" for name, n in sorted((parts or {}).items(), key=lambda kv: -kv[1]))
        kept = (
            f"; the store keeps {reserved:,} bytes of the document for its trace ring and dedupe window"
            if reserved
            else ""
        )
        super().__init__(
            f"execution {execution_id!r} is too large to store: {size:,} bytes where {limit:,} fit, "
            f"over by {max(size - limit, 0):,} bytes"
            + (f" ({detail})" if detail else "")
            + kept
            + "; the stored copy is unchanged"
        )
        self.execution_id = execution_id
        self.size = size
        self.limit = limit
        self.parts = dict(parts or {})
        self.reserved = reserved


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


class ShardPlanError(RuntimeError):
    """A partitioned collection of a sharded cluster is sharded on a key other than the
    shard plan's (`harel_beanie.core.partitions.SHARD_PLAN`): its commands would reach every
    shard, or be refused. `problems` holds one message per collection, each naming its fix."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


class ConfigError(Exception):
    """A setting a command cannot work with: printed as one line, exit code 2."""


class CommandFailed(Exception):
    """A command refused or failed in a way it explains: printed as one line, exit `code`."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code
