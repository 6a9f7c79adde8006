"""`harel-beanie migrate-transport up|down|status`: moving a deployment's undelivered messages
between harel's Mongo transport and this package's (`harel_beanie.transport.moving`).

Why this module exists: a deployment switching `harel-beanie worker` from `--transport harel`
to the default (or back) has messages waiting in the transport it leaves. With the workers
and the publishers stopped, `up` moves them into this package's queues and `down` back into
harel's; `status` says how many wait in each. A run cut short is finished by running it again.
"""

from __future__ import annotations

import asyncio
from typing import Any

from harel_beanie.core.errors import CommandFailed
from harel_beanie.deploy.stack import TRANSPORTS, open_client, queued
from harel_beanie.deploy.where import Target
from harel_beanie.transport.moving import MoveRefused, down, up


async def run(args: Any, target: Target) -> None:
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
    try:
        asyncio.run(run(args, target))
    except MoveRefused as exc:
        raise CommandFailed(str(exc)) from None
    return 0
