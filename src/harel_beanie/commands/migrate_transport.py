"""`harel-beanie migrate-transport up|down|status`: moving a deployment's undelivered messages
between harel's Mongo transport and this package's (`harel_beanie.transport.moving`).

Why this module exists: a deployment switching `harel-beanie worker` from `--transport harel`
to the default (or back) has messages waiting in the transport it leaves. With the workers
and the publishers stopped, `up` moves them into this package's queues and `down` back into
harel's; `status` says how many wait in each. A run cut short is finished by running it again.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from harel_beanie.core.errors import CommandFailed

if TYPE_CHECKING:
    from harel_beanie.deploy.where import Target

NAME = "migrate-transport"
HELP = "move undelivered messages between harel's Mongo transport and this package's"
DESCRIPTION = (
    "With the workers and the publishers stopped, move the messages waiting in harel's Mongo transport into this "
    "package's queues (up), or back (down); status counts both. Running it again finishes a run cut short."
)
WHERE = "url"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action",
        choices=("up", "down", "status"),
        help="up: into this package's transport; down: back into harel's; status: what waits in each",
    )


async def run(args: Any, target: Target) -> None:
    from harel_beanie.deploy.stack import TRANSPORTS, open_client, queued
    from harel_beanie.transport.moving import down, up

    client = await open_client(target)
    try:
        db = client[target.db]
        if args.action == "up":
            await up(db, target.prefix)
        elif args.action == "down":
            await down(db, target.prefix)
        for kind in TRANSPORTS:
            which = "this package's transport" if kind == "beanie" else "harel's Mongo transport"
            print(f"{await queued(db, target.prefix, kind)} message(s) wait in {which} ({kind})")
    finally:
        await client.close()


def main(args: Any, target: Target) -> int:
    import asyncio

    from harel_beanie.transport.moving import MoveRefused

    try:
        asyncio.run(run(args, target))
    except MoveRefused as exc:
        raise CommandFailed(str(exc)) from None
    return 0
