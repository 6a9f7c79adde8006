"""`harel-beanie prune`: retention from the command line, with a progress bar.

Why this module exists: `harel_beanie.retention.pruning` does the work; this module turns the
command's flags into a cut-off and an archive, shows progress (rich), and prints what was
removed and what was kept and why. `--ttl off` drops the retired TTL index; `--ttl AGE` is
refused, naming `harel-beanie worker --retain`, which replaced it (the server's expiries went
behind the counters' back, and the counts drifted for good).

Removing is not undone, so the command refuses what it could misread: an age without its unit
(`30`: seconds or days?) is refused naming the units (`harel_beanie.core.ages`); on a terminal
it first counts what it would remove and asks; with no terminal to ask on (a cron job, a
script) it removes only when `--yes` says so, and says that in one line otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from harel_beanie.commands import flags
from harel_beanie.core.ages import parse_before
from harel_beanie.core.errors import CommandFailed, ConfigError

if TYPE_CHECKING:
    from rich.console import Console

    from harel_beanie.deploy.where import Target
    from harel_beanie.retention.pruning import PruneReport

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
        help="an age with its unit (30d, 12h, 90m, 2w; a bare number is refused), an ISO date/date-time (UTC "
        "unless given), or @epoch",
    )
    p.add_argument("--archive", metavar="FILE.jsonl", help="append each removed execution to this JSON Lines file")
    p.add_argument("--archive-collection", metavar="NAME", help="copy each removed execution into this collection")
    p.add_argument("--dry-run", action="store_true", help="count what would be removed; change nothing")
    p.add_argument(
        "--yes",
        action="store_true",
        help="remove without asking (on a terminal it counts first and asks; with no terminal, as from cron, "
        "it removes nothing unless --yes is given)",
    )
    p.add_argument(
        "--batch-size", type=flags.positive_int, default=500, metavar="N", help="executions per batch (default 500)"
    )
    p.add_argument(
        "--ttl",
        metavar="off",
        help="instead: drop the TTL index an older release created ('off'; retention by age is now "
        "`harel-beanie worker --retain AGE`, which keeps the counts exact)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")


#: what a user types to go ahead at the prompt
YES = ("y", "yes")


def ask(question: str) -> bool:
    """The user's answer on the terminal (anything but y/yes, or end of input, is a no). The
    question goes to stderr, so that with `--json` stdout holds only the report."""
    sys.stderr.write(question)
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in YES


async def run(args: Any, target: Target, console: Console, confirm: Callable[[str], bool] = ask) -> PruneReport | str:
    """Kept whole: the progress display, the batches and the report share one client and one running total."""
    from harel.engine.schema import Names
    from rich.markup import escape

    from harel_beanie.deploy.stack import open_client
    from harel_beanie.deploy.where import mistyped_db
    from harel_beanie.retention import archive as archives
    from harel_beanie.retention import pruning as retention

    client = await open_client(target)
    try:
        hint = await mistyped_db(client, target.db, target.prefix)
        if hint is not None:
            raise ConfigError(hint)
        executions = client[target.db][Names(target.prefix).executions]
        if args.ttl is not None:  # `check_flags` let only "off" through
            return await retention.drop_ttl(executions)
        before = parse_before(args.finished_before)
        archive: Optional[archives.Archive] = None
        if args.archive:
            archive = archives.JsonlArchive(args.archive)
        elif args.archive_collection:
            archive = archives.CollectionArchive(client[target.db], args.archive_collection)
        total = await _upper_bound(executions, before)
        console.print(
            f"[bold]harel-beanie prune[/]: up to {total} execution(s) finished before "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(before))} on {escape(target.masked_url)}, "
            f"database {target.db}, prefix {target.prefix}" + (" (dry run)" if args.dry_run else "")
        )
        if not args.dry_run and not args.yes:  # on a terminal (`check_flags`): count, then ask
            counted = await _pass(console, executions, before, total, args.batch_size, dry_run=True)
            if not counted.removed:
                return counted
            if not confirm(f"Remove {counted.removed} of {counted.examined} finished execution(s)? [y/N] "):
                raise CommandFailed("nothing removed (not confirmed)")
        return await _pass(console, executions, before, total, args.batch_size, dry_run=args.dry_run, archive=archive)
    finally:
        await client.close()


async def _upper_bound(executions: Any, before: float) -> int:
    """How many finished executions the run examines at most."""
    from harel_beanie.core.windows import Window
    from harel_beanie.retention import pruning as retention

    total = 0
    for status in retention.FINISHED:
        # a range of hb_status_updated on every server (a count of `candidates_filter`
        # reads every finished execution on SecantusDB): an upper bound of what is examined
        for window in (Window(None, before), None):  # None: no `updated_at`
            total += await executions.count_documents(retention.window_filter(status, window))
    return total


async def _pass(
    console: Console,
    executions: Any,
    before: float,
    total: int,
    batch_size: int,
    *,
    dry_run: bool,
    archive: Any = None,
) -> PruneReport:
    """One pass of `prune` over the finished executions, with a progress bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from harel_beanie.retention import pruning as retention

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(bar_width=30),
        MofNCompleteColumn(),
        TextColumn("{task.fields[removed]} " + ("to remove" if dry_run else "removed")),
        TimeElapsedColumn(),
        console=console,
    )
    with progress:
        bar = progress.add_task("examining", total=max(total, 1), removed=0)

        def step(r: PruneReport) -> None:
            progress.update(bar, completed=r.examined, removed=r.removed)

        report = await retention.prune(
            executions, before, archive=archive, dry_run=dry_run, batch_size=batch_size, on_batch=step
        )
        progress.update(bar, completed=max(report.examined, 1) if not total else report.examined)
    return report


def check_flags(args: Any) -> None:
    """The cut-off, the TTL and the archive, refused naming their flag before any server starts."""
    if args.ttl is None and not args.finished_before:
        raise ConfigError("say what to remove: --finished-before AGE|DATE (or --ttl off to drop the TTL index)")
    if args.archive and args.archive_collection:
        raise ConfigError("--archive and --archive-collection: choose one")
    if args.ttl is not None:
        if args.ttl != "off":
            raise ConfigError(
                "--ttl AGE is retired (the server's expiries drifted the counts): retain with "
                "`harel-beanie worker --retain AGE` instead; `--ttl off` drops an existing index"
            )
        return
    flags.value_of("--finished-before", parse_before, args.finished_before)
    if not args.dry_run and not args.yes and not sys.stdin.isatty():
        raise ConfigError(
            "prune removes executions and there is no terminal to ask on: pass --yes to remove without asking "
            "(or --dry-run to count)"
        )


def main(args: Any, target: Target) -> int:
    import asyncio

    from rich.console import Console
    from rich.markup import escape

    from harel_beanie.retention import pruning as retention

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
