"""`harel-beanie prune --archive` (or `--archive-collection`) that kills itself (SIGKILL) at one
step of one batch.

    python -m tests.support.crash_prune POINT BATCH [harel-beanie prune flags...]

runs the real command, with one change: at `POINT` of batch `BATCH` (0-based, counted by the
journal writes) the process sends itself SIGKILL, so no `finally`, no flush and no exit
handler runs, as when the machine or an operator kills it. The steps of a batch, in order:

- `begin-before`: before the batch's journal is written;
- `begin-torn`: half-way through writing the journal (a file's last line cut; half of the
  records inserted in the journal collection);
- `begin-after`: the journal written, nothing deleted yet;
- `delete-after`: the deletes done, before the run learns which landed;
- `append-torn`: half-way through appending to the archive (a file's last line cut; half of
  the records copied to the collection);
- `append-after`: the archive appended, before the journal is cleared;
- `finish-after`: the journal cleared, before the next batch;
- `recover-torn`: half-way through the append of a later run's recovery (BATCH ignored).

Before dying it prints `KILLED POINT` on stderr, so the test can tell that the fault fired.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from pymongo import DeleteOne
from pymongo.asynchronous.collection import AsyncCollection

from harel_beanie.commands import cli
from harel_beanie.retention import archive

POINTS = (
    "begin-before",
    "begin-torn",
    "begin-after",
    "delete-after",
    "append-torn",
    "append-after",
    "finish-after",
    "recover-torn",
)


def install(point: str, batch: int) -> None:
    if point not in POINTS:
        raise SystemExit(f"unknown point {point!r}; one of {', '.join(POINTS)}")
    state = {"batch": -1, "recovering": False}

    def here(name: str) -> bool:
        return point == name and (state["batch"] == batch or name == "recover-torn")

    def die(name: str) -> None:
        print(f"KILLED {name}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    def torn_now(journal: bool) -> bool:
        if journal:
            return here("begin-torn")
        return here("recover-torn") if state["recovering"] else here("append-torn")

    def appended_now() -> bool:
        return not state["recovering"] and here("append-after")

    write = archive._write

    def torn_write(path: Path, text: str, mode: str) -> None:
        journal = path.name.endswith(".pending")
        if torn_now(journal):
            with open(path, mode, encoding="utf-8") as f:
                f.write(text[: max(1, len(text) // 2 + 3)])  # a whole line or more, then a cut one
                f.flush()
                os.fsync(f.fileno())
            die(point)
        write(path, text, mode)
        if not journal and appended_now():
            die(point)

    log, copy = archive.CollectionArchive._log, archive.CollectionArchive._copy

    async def torn_log(self: Any, records: list[dict[str, Any]]) -> None:
        if torn_now(True):
            await log(self, records[: len(records) // 2])
            die(point)
        await log(self, records)

    async def torn_copy(self: Any, records: list[dict[str, Any]]) -> None:
        if records and torn_now(False):
            await copy(self, records[: len(records) // 2])
            die(point)
        await copy(self, records)
        if records and appended_now():
            die(point)

    def watch(kind: Any) -> None:
        begin, finish, recover = kind.begin, kind.finish, kind.recover

        async def counted_begin(self: Any, docs: list[dict[str, Any]]) -> None:
            state["batch"] += 1
            if here("begin-before"):
                die(point)
            await begin(self, docs)
            if here("begin-after"):
                die(point)

        async def killed_finish(self: Any, removed: list[dict[str, Any]]) -> None:
            await finish(self, removed)
            if here("finish-after"):
                die(point)

        async def watched_recover(self: Any, executions: Any, now: Any = None) -> int:
            state["recovering"] = True
            try:
                return await recover(self, executions, now)
            finally:
                state["recovering"] = False

        kind.begin, kind.finish, kind.recover = counted_begin, killed_finish, watched_recover

    bulk_write = AsyncCollection.bulk_write

    async def killed_bulk_write(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = await bulk_write(self, *args, **kwargs)
        # the deletes' bulk write, not the leaving marks' (a run killed after its marks
        # leaves them to hold for `retention.removal.LEASE`), nor the archive's copy
        deletes = any(isinstance(op, DeleteOne) for op in (args[0] if args else kwargs.get("requests") or ()))
        if here("delete-after") and self.name.endswith("_executions") and deletes:
            die(point)
        return result

    archive._write = torn_write  # type: ignore[assignment]
    archive.CollectionArchive._log = torn_log  # type: ignore[method-assign]
    archive.CollectionArchive._copy = torn_copy  # type: ignore[method-assign]
    watch(archive.JsonlArchive)
    watch(archive.CollectionArchive)
    AsyncCollection.bulk_write = killed_bulk_write  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    install(argv[0], int(argv[1]))
    return cli.main(["prune", "--yes", *argv[2:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
