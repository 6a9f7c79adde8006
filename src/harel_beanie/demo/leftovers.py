"""What an interrupted demo leaves behind, found and cleared before the next run starts.

Why this module exists: a demo run replays a week of shop time on a simulated clock that
starts a week back. A run stopped midway (Ctrl-C, killed, its server killed) leaves
executions still RUNNING, queue groups, outbox entries and timers stamped on its own clock;
the next run's clock starts a week before them, so its workers never reach them and its
first wait saw them stand still (`DemoStalled` on every later run in that folder). Adopting
them would mean replaying the earlier run's script from a point nobody recorded, so the demo
starts over instead: each run records itself in `<prefix>_hb_demo_runs` when it starts and
marks itself finished once its report is made, and the next run that finds a run not so
marked (or, in data made before these records, a `demo-` execution still going) drops the
demo's database and starts afresh, saying so in one line.

It drops a database only when that is the demo's own: on the embedded server in the demo's
data folder, holding nothing but the demo's executions. Anywhere else (a server given by URL,
or executions of someone else's in it) it refuses in one line naming `--fresh`, the flag that
asks for the drop explicitly.
"""

from __future__ import annotations

import shlex
import time
from typing import Any

from harel.engine.schema import Names

from harel_beanie.core.errors import ConfigError
from harel_beanie.deploy.where import DEFAULT_DB, Target

#: every demo run's executions start with its run id, `demo-` and six hex digits
RUN_ID_PREFIX = "demo-"
RUN_ID_LENGTH = len(RUN_ID_PREFIX) + 6
#: what harel counts as an execution that will not move again
SETTLED = ("DONE", "FAILED", "CANCELLED")


def runs_name(prefix: str) -> str:
    """The collection of the demo's run records."""
    return f"{prefix}_hb_demo_runs"


def fresh_command(target: Target) -> str:
    """The command that starts the demo over on `target` (what `DemoStalled` names)."""
    flags = "" if target.embedded else f" --url {shlex.quote(target.masked_url)}"
    flags += "" if target.db == DEFAULT_DB else f" --db {shlex.quote(target.db)}"
    if target.embedded and target.data_dir is not None and str(target.data_dir) != "harel-beanie-data":
        flags += f" --data {shlex.quote(str(target.data_dir))}"
    return f"harel-beanie demo{flags} --fresh"


async def unfinished_runs(db: Any, prefix: str) -> list[str]:
    """The run ids of earlier runs that never reached their report: recorded and not marked
    finished, or (data from before the records) with a `demo-` execution still going."""
    runs = db[runs_name(prefix)]
    found = {r["_id"] async for r in runs.find({"finished_at": None}, {"_id": 1})}
    finished = {r["_id"] async for r in runs.find({"finished_at": {"$ne": None}}, {"_id": 1})}
    going = await (
        await db[Names(prefix).executions].aggregate(
            [
                {"$match": {"_id": {"$regex": f"^{RUN_ID_PREFIX}"}, "status": {"$nin": list(SETTLED)}}},
                {"$group": {"_id": {"$substrCP": ["$_id", 0, RUN_ID_LENGTH]}}},
            ]
        )
    ).to_list(None)
    found.update(r["_id"] for r in going if r["_id"] not in finished)
    return sorted(found)


async def start_over(client: Any, target: Target, *, fresh: bool) -> str:
    """Drop the demo's database when `fresh` asks for it, or when an earlier run was
    interrupted and the database is the demo's own; the one line to print ("" when nothing
    was done). Refuses (`ConfigError`) to drop a database that may hold anything else."""
    db = client[target.db]
    where = f"database {target.db}" + (f" in {target.data_dir}/" if target.embedded else "")
    if fresh:
        n = await db[Names(target.prefix).executions].estimated_document_count()
        if not await db.list_collection_names():
            return f"Starting over (--fresh): the demo's {where} is empty."
        await client.drop_database(target.db)
        return f"Starting over (--fresh): dropped the demo's {where} ({n} executions)."
    interrupted = await unfinished_runs(db, target.prefix)
    if not interrupted:
        return ""
    named = ", ".join(interrupted[-3:]) + (" …" if len(interrupted) > 3 else "")
    others = await db[Names(target.prefix).executions].count_documents({"_id": {"$not": {"$regex": "^demo-"}}})
    if not target.embedded or others:
        why = "it is not the demo's own data folder" if not target.embedded else f"it holds {others} other executions"
        raise ConfigError(
            f"an earlier demo run ({named}) on {where} did not finish, and its leftover work would stall this one; "
            f"{why}, so the demo leaves it alone: run `{fresh_command(target)}` to drop {where} and start over, "
            "or pass another --db"
        )
    n = await db[Names(target.prefix).executions].estimated_document_count()
    await client.drop_database(target.db)
    runs = "run" if len(interrupted) == 1 else "runs"
    return f"Starting over: earlier {runs} {named} interrupted; dropped the demo's {where} ({n} executions)."


async def record_start(db: Any, prefix: str, run_id: str) -> None:
    """The run's record, written before it does anything a later run would have to clear."""
    await db[runs_name(prefix)].insert_one({"_id": run_id, "started_at": time.time(), "finished_at": None})


async def record_finish(db: Any, prefix: str, run_id: str) -> None:
    """Marked once the run's work is done and counted: a later run keeps what it made."""
    await db[runs_name(prefix)].update_one({"_id": run_id}, {"$set": {"finished_at": time.time()}})
