"""`CommitOutcomeUnknown`: a commit whose outcome cannot be learned.

Why this module exists: it is a driver error (a `ConnectionFailure`, so callers treat it as
they treat a lost reply), and importing the driver costs a command line a fifth of a second;
the other errors of `harel_beanie.core.errors` stay free of it.
"""

from __future__ import annotations

from pymongo.errors import ConnectionFailure


class CommitOutcomeUnknown(ConnectionFailure):
    """A commit whose reply was lost (or that the driver may have retried after its first
    attempt landed) and whose outcome the store cannot learn: more commits than the
    execution remembers tokens of landed after it, so its token would have been pushed out
    of the window either way, and the event it consumed is marked processed. It may have
    been applied or not; nothing says which. A `ConnectionFailure`, so the caller treats it
    as it treats a lost reply: harel redelivers the event and its dedupe decides. Never a
    `StoreConflict`, which says the write was not applied."""

    def __init__(self, execution_id: str, expected: int, found: int) -> None:
        super().__init__(
            f"the commit to {execution_id!r} at version {expected} lost its reply and {found - expected} commits "
            f"landed since (version {found}): whether it was applied cannot be learned; its event is marked "
            "processed, so a redelivery is dropped"
        )
        self.execution_id = execution_id
        self.expected = expected
        self.found = found
