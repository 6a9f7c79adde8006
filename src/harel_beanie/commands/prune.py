"""`harel-beanie prune`: retention from the command line, with a progress bar.

Why this module exists: `harel_beanie.retention.pruning` does the work; this module turns the
command's flags into a cut-off and an archive, shows progress (rich), and prints what was
removed and what was kept and why. `--ttl` instead sets, changes or drops the TTL index.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any, Optional

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harel_beanie.commands import flags
from harel_beanie.core.errors import ConfigError
from harel_beanie.core.windows import Window
from harel_beanie.deploy.stack import open_client
from harel_beanie.deploy.where import Target
from harel_beanie.retention import archive as archives
from harel_beanie.retention import pruning as retention

NAME = "prune"
HELP = "remove (or archive) finished executions older than a cut-off"
DESCRIPTION = (
    "Remove DONE/CANCELLED executions that finished before the cut-off, in batches, each delete guarded on what "
    "was read; executions whose parent is still going, or with events still to hand on, are kept. Re-running "
    "continues an interrupted run. FAILED executions are never removed (redrive or terminate them)."
)
WHERE = "embedded"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--finished-before",
        metavar="AGE|DATE",
        help="an age (30d, 12h, 90m), an ISO date/date-time (UTC unless given), or @epoch",
    )
    p.add_argument("--archive", metavar="FILE.jsonl", help="append each removed execution to this JSON Lines file")
    p.add_argument("--archive-collection", metavar="NAME", help="copy each removed execution into this collection")
    p.add_argument("--dry-run", action="store_true", help="count what would be removed; change nothing")
    p.add_argument(
        "--batch-size", type=flags.positive_int, default=500, metavar="N", help="executions per batch (default 500)"
    )
    p.add_argument(
        "--ttl",
        metavar="AGE|off",
        help="instead: create or change the TTL index on finished_on (the server expires finished executions by "
        "age alone), or drop it with 'off'",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")


async def run(args: Any, target: Target, console: Console) -> retention.PruneReport | str:
    """Kept whole: the progress display, the batches and the report share one client and one running total."""
    from harel.engine.schema import Names

    client = await open_client(target)
    try:
        executions = client[target.db][Names(target.prefix).executions]
        if args.ttl is not None:
            seconds: Optional[float] = None if args.ttl == "off" else retention.parse_age(args.ttl)
            done = await retention.ensure_ttl(executions, seconds)
            if seconds is not None:  # what the index will and will not do (docs/operations.md)
                undated = await executions.count_documents(retention.undated_filter())
                done += (
                    f"\nthe server will remove each DONE or CANCELLED execution {escape(args.ttl)} after it "
                    "finished (by finished_on, which every commit writes), unarchived, whatever its parent "
                    "or pending work"
                )
                if undated:
                    done += (
                        f"\n{undated} finished execution(s) carry no finished_on (last written before it "
                        "existed): the index leaves them to prune --finished-before"
                    )
            return done
        before = retention.parse_before(args.finished_before)
        archive: Optional[archives.Archive] = None
        if args.archive:
            archive = archives.JsonlArchive(args.archive)
        elif args.archive_collection:
            archive = archives.CollectionArchive(client[target.db], args.archive_collection)
        total = 0
        for status in retention.FINISHED:
            # a range of hb_status_updated on every server (a count of `candidates_filter`
            # reads every finished execution on SecantusDB): an upper bound of what is examined
            for window in (Window(None, before), None):  # None: no `updated_at`
                total += await executions.count_documents(retention.window_filter(status, window))
        console.print(
            f"[bold]harel-beanie prune[/]: up to {total} execution(s) finished before "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(before))} on {escape(target.masked_url)}, "
            f"database {target.db}, prefix {target.prefix}" + (" (dry run)" if args.dry_run else "")
        )
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=30),
            MofNCompleteColumn(),
            TextColumn("{task.fields[removed]} " + ("to remove" if args.dry_run else "removed")),
            TimeElapsedColumn(),
            console=console,
        )
        with progress:
            bar = progress.add_task("examining", total=max(total, 1), removed=0)

            def step(r: retention.PruneReport) -> None:
                progress.update(bar, completed=r.examined, removed=r.removed)

            report = await retention.prune(
                executions, before, archive=archive, dry_run=args.dry_run, batch_size=args.batch_size, on_batch=step
            )
            progress.update(bar, completed=max(report.examined, 1) if not total else report.examined)
        return report
    finally:
        await client.close()


def check_flags(args: Any) -> None:
    """The cut-off, the TTL and the archive, refused naming their flag before any server starts."""
    if args.ttl is None and not args.finished_before:
        raise ConfigError("say what to remove: --finished-before AGE|DATE (or --ttl AGE|off for the TTL index)")
    if args.archive and args.archive_collection:
        raise ConfigError("--archive and --archive-collection: choose one")
    if args.ttl is not None:
        if args.ttl != "off":
            flags.value_of("--ttl", retention.parse_age, args.ttl)
    else:
        flags.value_of("--finished-before", retention.parse_before, args.finished_before)


def main(args: Any, target: Target) -> int:
    console = Console(highlight=False, stderr=bool(args.json))  # --json: stdout holds only the report
    check_flags(args)  # (the CLI ran it already; a caller of main may not have)
    try:
        out = asyncio.run(run(args, target, console))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if isinstance(out, str):
        console.print(out)
        return 0
    r = out
    if args.json:
        print(retention.dumps_report(r))
        return 0
    what = "would be removed" if r.dry_run else "removed"
    console.print(f"{r.removed} {what} of {r.examined} finished before the cut-off, in {r.batches} batch(es)")
    if r.kept_parent:
        console.print(f"  kept {r.kept_parent}: the parent is still going (not DONE/CANCELLED)")
    if r.kept_pending:
        console.print(f"  kept {r.kept_pending}: outbox entries or spawns still to hand on")
    if r.moved_on:
        console.print(f"  left {r.moved_on}: changed while being pruned")
    if r.recovered:
        console.print(f"  archived {r.recovered} removed by an interrupted earlier run")
    if not r.dry_run and (args.archive or args.archive_collection):
        console.print(f"  archived to {escape(args.archive or args.archive_collection)}")
    return 0
