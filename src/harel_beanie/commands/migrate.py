"""`harel-beanie migrate up|down|status`: the migration engine from the command line.

Why this module exists: `harel_beanie.commands.cli` parses the flags and `harel_beanie.deploy.where`
resolves the server, database and prefix, as for every command; this module turns the
action into `Migrator` calls, prints what each step did, and turns what can go wrong during
a migration into one line: a refusal or failure (exit 1: the message says what to do, and
running the same command again resumes), an interruption (exit 130, resumable too).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from harel_beanie.commands import flags
from harel_beanie.core.errors import CommandFailed, ConfigError

if TYPE_CHECKING:
    from harel_beanie.deploy.where import Target

NAME = "migrate"
HELP = "move a database between layout versions (0: harel's MongoStore layout)"
DESCRIPTION = (
    "Move a harel-beanie database between layout versions (0 is harel's own MongoStore layout), in batches, "
    "resuming where an interrupted run stopped. Stop the workers on the database first."
)
#: never the embedded server: a migration is for a deployment's database, and the embedded
#: one's data was written by this package, at its layout
WHERE = "url"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action",
        choices=("up", "down", "status"),
        help="up: to this package's layout; down: one version back (or --to); status: what the database holds",
    )
    p.add_argument("--to", type=int, metavar="VERSION", help="target layout version (0 = harel's MongoStore)")
    p.add_argument("--batch-size", type=flags.positive_int, metavar="N", help="executions per batch (default 500)")
    # the flag's name before migrate shared the other commands' connection flags
    p.add_argument("--timeout", dest="connect_timeout", type=flags.ping, help=argparse.SUPPRESS)


RESUME = "run the same command again to resume"


async def run(args: Any, target: Target) -> None:
    from harel_beanie.core.documents import SCHEMA_VERSION
    from harel_beanie.deploy.stack import open_client
    from harel_beanie.deploy.where import mistyped_db
    from harel_beanie.migrate.engine import BATCH_SIZE, Migrator

    client = await open_client(target)
    try:
        # `status` on a mistyped name would say to migrate it up; `up` may start a new database
        hint = await mistyped_db(client, target.db, target.prefix) if args.action == "status" else None
        if hint is not None:
            raise ConfigError(hint)
        m = Migrator(client[target.db], target.prefix, batch_size=args.batch_size or BATCH_SIZE, say=print)
        if args.action == "status":
            for line in (await m.status()).lines(m.where):
                print(line)
            return
        if args.action == "up":
            await m.up(SCHEMA_VERSION if args.to is None else args.to)
        else:
            await m.down(args.to)
        print(f"{m.where}: at layout version {(await m.status()).version}")
    finally:
        await client.close()


def main(args: Any, target: Target) -> int:
    """Run `args.action` against `target` (see `harel_beanie.commands.cli` for the flags)."""
    import asyncio

    from pymongo.errors import PyMongoError

    from harel_beanie.core.documents import SCHEMA_VERSION
    from harel_beanie.migrate.engine import MigrationError
    from harel_beanie.store.connect import driver_message

    if args.to is not None and args.action == "status":
        raise ConfigError("--to goes with up or down")
    if args.to is not None and not 0 <= args.to <= SCHEMA_VERSION:
        raise ConfigError(f"--to must be a layout version from 0 to {SCHEMA_VERSION}, got {args.to}")
    try:
        asyncio.run(run(args, target))
    except MigrationError as err:
        raise CommandFailed(str(err)) from None
    except PyMongoError as err:
        raise CommandFailed(
            f"the server failed during the migration ({type(err).__name__}: {driver_message(err)}); {RESUME}"
        ) from None
    except KeyboardInterrupt:
        raise CommandFailed(f"interrupted; {RESUME}", code=130) from None
    return 0
