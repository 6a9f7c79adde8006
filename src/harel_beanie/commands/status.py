"""`harel-beanie status`: backlog and health at a glance, as tables or `--json`.

Why this module exists: an operator asks "is anything stuck, and how much is waiting?"
This answers from the store's indexed fields (`harel_beanie.queries.backlog`: executions by
definition and status, the pending outbox and the age of its oldest entry, pending spawns,
the executions holding the oldest of them (`harel_beanie.queries.oldest`), due and next
timers, the stuck executions: `harel_beanie.core.stuck`) plus the queue of harel's Mongo transport (events queued, executions leased by a worker). `--json`
prints the same figures for scripts and monitoring; times are epoch seconds, ages seconds.

It reads only: the store is opened without creating indexes or layout markers.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from harel_beanie.commands import flags

if TYPE_CHECKING:
    from rich.console import Console

    from harel_beanie.deploy.where import Target

NAME = "status"
HELP = "backlog and health: counts, pending work, timers, stuck executions"
DESCRIPTION = (
    "What is pending and what is stuck: executions by definition and status, pending outbox and spawns, due "
    "and next timers, RUNNING executions silent for longer than --stuck-after with no timer ahead and nothing "
    "pending, or holding a timer overdue by as long (waiting on a timer or on pending work is not stuck)."
)
WHERE = "embedded"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of tables")
    flags.stuck_after(p, "stuck")
    p.add_argument(
        "--show",
        type=flags.positive_int,
        default=10,
        metavar="N",
        help="list at most N next timers and stuck executions (default 10)",
    )


#: what the stuck list is (harel_beanie.core.stuck), as its title and when it is empty
STUCK_TITLE = "Stuck: RUNNING, silent for more than {} with nothing to wake it, or a timer overdue by as long"
NOTHING_STUCK = (
    "Nothing stuck: no RUNNING execution silent for more than {} with nothing to wake it, and no timer "
    "overdue by as long (waiting on a timer or pending work is not stuck)."
)


async def collect(target: Target, stuck_after: float, show: int) -> dict[str, Any]:
    """Everything `status` shows, as plain data."""
    from harel.engine.schema import Names

    from harel_beanie.core.documents import bind
    from harel_beanie.deploy.stack import open_client
    from harel_beanie.deploy.where import mistyped_db
    from harel_beanie.queries.samples import sampled_backlog, samples_name
    from harel_beanie.store.async_store import AsyncMongoStore

    client = await open_client(target)
    store = AsyncMongoStore(client, target.db, prefix=target.prefix, create_schema=False)
    try:
        await store.init()  # binds the Beanie classes; checks the layout version
        names = Names(target.prefix)
        db = client[target.db]
        # the pending entries from the newest per-minute sample (a worker or a dashboard takes
        # one): reading them here would read every document holding one
        samples = db[samples_name(target.prefix)]
        b = await sampled_backlog(bind(target.prefix)[0], samples, stuck_after=stuck_after, show=show)
        queued = await db[names.messages].count_documents({})
        leased = await db[names.transport_locks].count_documents({"token": {"$ne": None}})
        # a new or mistyped database: where the server does keep executions
        # (counts partial: executions are stored, their partitions not counted yet)
        counted = sum(sum(per.values()) for per in b.counts.values()) or b.unbuilt
        found = [] if counted else await elsewhere(client, target)
        hint = None if counted else await mistyped_db(client, target.db, target.prefix)
    finally:
        await store.close()
    out = b.as_dict()
    for row in (*out["oldest_outbox"], *out["oldest_spawns"]):
        row["page"] = execution_page(row["id"])
    totals: dict[str, int] = {}
    for per in b.counts.values():
        for status, n in per.items():
            totals[status] = totals.get(status, 0) + n
    out["totals"] = totals
    out["executions"] = sum(totals.values())
    out["transport"] = {"queued": queued, "leased": leased}
    out["where"] = {"url": target.masked_url, "db": target.db, "prefix": target.prefix}
    if not out["executions"]:
        out["elsewhere"] = found
        out["did_you_mean"] = hint
    return out


def execution_page(execution_id: str) -> str:
    """The execution's page on `harel-beanie dashboard` (served at its root), the id
    percent-encoded whole as the dashboard's own links carry it (`dashboard.links`)."""
    return f"/execution?id={quote(execution_id, safe='')}"


async def elsewhere(client: Any, target: Target, limit: int = 5) -> list[dict[str, Any]]:
    """The databases and prefixes on this server that hold executions, other than the
    target's (`--db`, `--prefix` mistyped, or the data written under other names), the names
    closest to the target's first (a typo's), then the most executions: what an empty answer
    points at. Estimated counts: a look, not a scan."""
    from difflib import SequenceMatcher

    from harel_beanie.deploy.where import SYSTEM_DBS

    def likeness(f: dict[str, Any]) -> float:
        return SequenceMatcher(None, f"{f['db']}/{f['prefix']}", f"{target.db}/{target.prefix}").ratio()

    found = []
    for name in await client.list_database_names():
        if name in SYSTEM_DBS:
            continue
        for coll in await client[name].list_collection_names():
            prefix = coll.removesuffix("_executions")
            if prefix == coll or (name, prefix) == (target.db, target.prefix):
                continue
            n = await client[name][coll].estimated_document_count()
            if n:
                found.append({"db": name, "prefix": prefix, "executions": n})
    return sorted(found, key=lambda f: (-likeness(f), -f["executions"]))[:limit]


def render(console: Console, data: dict[str, Any]) -> None:
    """Kept whole: it is the command's output in the order it is printed, a table or line at a time."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from harel_beanie.queries.backlog import human_duration

    w = data["where"]
    now = data["now"]
    console.print(
        f"[bold]harel-beanie status[/]: {escape(w['url'])} database {w['db']} prefix {w['prefix']}, "
        f"at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))}"
    )
    _executions(console, data)
    if data["purged"]:
        console.print(f"{data['purged']} purged execution id(s) hold a tombstone (kept so the id is never reused).")

    title = "Pending work"
    counted = data.get("entries_at")
    if counted is not None and now - counted >= 1:  # from a sample: say how old it is
        title += f" (entries from a sample {human_duration(now - counted)} old)"
    p = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", show_header=False)
    p.add_column("what")
    p.add_column("n", justify="right")
    p.add_column("")
    age = data["oldest_outbox_age"]
    p.add_row(
        "outbox entries (events to relay)",
        str(data["pending_outbox"]),
        f"oldest {human_duration(age)} old" if age is not None and data["pending_outbox"] else "",
    )
    p.add_row("spawns (children to create)", str(data["pending_spawns"]), "")
    p.add_row("timers due now", str(data["due_timers"]), "")
    tr = data["transport"]
    p.add_row("events queued on the transport", str(tr["queued"]), f"{tr['leased']} execution(s) leased by a worker")
    console.print(p)
    _oldest(console, data)

    if data["next_timers"]:
        t = Table(box=box.SIMPLE_HEAD, title="Next timers", title_justify="left")
        for col in ("execution", "definition", "timer", "fires"):
            t.add_column(col)
        for row in data["next_timers"]:
            delta = row["fire_at"] - now
            t.add_row(
                Text(row["id"]),
                Text(row["definition_id"]),
                Text(row["path"]),
                f"due {human_duration(delta)} ago" if delta <= 0 else f"in {human_duration(delta)}",
            )
        console.print(t)
    stuck_after = data["stuck_after"]
    if data["stuck"]:
        t = Table(
            box=box.SIMPLE_HEAD,
            title=STUCK_TITLE.format(human_duration(stuck_after)),
            title_justify="left",
            title_style="bold red",
        )
        for col in ("execution", "definition", "active state", "silent for"):
            t.add_column(col)
        for row in data["stuck"]:
            # ids, definitions and paths are data: shown as text, never read as rich markup
            t.add_row(
                Text(row["id"]),
                Text(row["definition_id"]),
                Text(row["active_path"] or ""),
                human_duration(row["silent_for"]),
            )
        console.print(t)
    else:
        console.print(NOTHING_STUCK.format(human_duration(stuck_after)))


def empty_hint(found: list[dict[str, Any]]) -> list[str]:
    """What to run when the database holds no executions: the flags naming those the server
    does hold, else the commands that make some."""
    if found:
        return ["This server holds executions elsewhere:"] + [
            f"  harel-beanie status --db {f['db']} --prefix {f['prefix']}   ({f['executions']} execution(s))"
            for f in found
        ]
    return [
        "Nothing here yet: `harel-beanie demo` runs the shop's models on this database; a worker "
        "(`harel-beanie worker --definitions DIR`) runs yours. If executions were expected, check --db and --prefix."
    ]


def _oldest(console: Console, data: dict[str, Any]) -> None:
    """The executions holding the oldest pending entries (read now, even where the counts
    above come from a sample), each with its page on the dashboard."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from harel_beanie.queries.backlog import human_duration

    rows = [*data["oldest_outbox"], *data["oldest_spawns"]]
    if not rows:
        return
    t = Table(box=box.SIMPLE_HEAD, title="Oldest pending entries, by execution (read now)", title_justify="left")
    for col in ("execution", "definition", "kind", "oldest entry", "entries", "dashboard page"):
        t.add_column(col)
    for row in rows:
        age = row["age"]
        t.add_row(
            Text(row["id"]),
            Text(row["definition_id"] or ""),
            "outbox entry" if row["kind"] == "outbox" else "spawn",
            f"{human_duration(age)} old" if age is not None else "age unknown",
            str(row["entries"]),
            Text(row["page"]),
        )
    console.print(t)


def _executions(console: Console, data: dict[str, Any]) -> None:
    """The executions by definition and status, or what to run when there are none."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from harel_beanie.queries import STATUSES

    w = data["where"]
    if data.get("unbuilt"):
        console.print(
            f"Counts partial: {len(data['unbuilt'])} partition(s) not counted yet (their counts are being built "
            "by the workers that own them, or run `harel-beanie migrate up`); the figures below leave them out."
        )
    if not data["executions"] and not data.get("unbuilt"):
        console.print(f"No executions in database {w['db']}, collection {w['prefix']}_executions.")
        if data.get("did_you_mean"):
            console.print(Text(data["did_you_mean"]))
        for line in empty_hint(data.get("elsewhere") or []):
            console.print(Text(line))
    else:
        # ids, definitions and paths below are data: shown as `Text`, never read as rich markup
        seen = [s for s in STATUSES if s in data["totals"]] + sorted(set(data["totals"]) - set(STATUSES))
        t = Table(box=box.SIMPLE_HEAD, title="Executions", title_justify="left")
        t.add_column("definition")
        for s in seen:
            t.add_column(s, justify="right")
        t.add_column("total", justify="right")
        for d in sorted(data["counts"]):
            per = data["counts"][d]
            t.add_row(Text(d), *[str(per.get(s, "")) for s in seen], str(sum(per.values())))
        t.add_section()
        t.add_row("all", *[str(data["totals"].get(s, "")) for s in seen], str(data["executions"]), style="bold")
        console.print(t)
        console.print(
            "Counted by status, where each execution is in its life (FAILED: stopped on an error, to redrive). "
            "Its outcome (success, failed, ...: what its model's final state says, once DONE) is another word: "
            "an order whose card was declined is DONE, outcome failed (the dashboard shows both)."
        )


def main(args: Any, target: Target) -> int:
    import asyncio

    from rich.console import Console

    data = asyncio.run(collect(target, args.stuck_after, args.show))
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        console = Console(highlight=False)
        if not console.is_terminal:
            console.width = max(console.width, 110)
        render(console, data)
    return 0
