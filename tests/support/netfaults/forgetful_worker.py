"""`harel-beanie worker` with the store's dedupe switched off: a broken worker, on purpose.

    python -m tests.support.netfaults.forgetful_worker [harel-beanie worker flags...]

The network-fault runs use it once, to show that their checker fails a run in which the
store does wrong (a test that cannot fail proves nothing). The store answers "not processed
yet" for every event, so an event delivered twice (a publish the network duplicated, a
lease that ran out under a partition) is applied twice, and the history shows it doubled.
Everything else is the real command.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from harel_beanie.commands import cli
from harel_beanie.store.async_store import AsyncMongoStore


async def _never_seen(self: AsyncMongoStore, execution_id: str, event_id: str) -> tuple[Optional[Any], bool]:
    return await self.load(execution_id), False


async def _not_processed(self: AsyncMongoStore, execution_id: str, event_id: str) -> bool:
    return False


def main(argv: list[str]) -> int:
    AsyncMongoStore.load_for_event = _never_seen  # type: ignore[method-assign]
    AsyncMongoStore.is_processed = _not_processed  # type: ignore[method-assign]
    return cli.main(["worker", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
