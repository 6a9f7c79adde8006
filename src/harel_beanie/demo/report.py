"""What `harel-beanie demo` prints once a run is over: the executions per model with their
events and round trips, how each scenario ended against what its model says, the round
trips by who sent them, where the data lives and the commands to look at it.

Why this module exists: the run (`harel_beanie.demo.run`) and its presentation change for
different reasons; the run hands over a `Result` and this module only formats it (rich).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from rich import box
from rich.console import Console
from rich.table import Table

from harel_beanie.deploy.loader import default_models_dir
from harel_beanie.deploy.where import DEFAULT_DB, SERVER_SOURCE, Target


@dataclass
class Result:
    """What one demo run did: what the report prints."""

    run_id: str
    elapsed: float
    earlier: int
    earlier_runs: list[str]
    per_model: dict[str, dict[str, Any]]
    endings: list[tuple[str, str, str, int, bool]]  # scenario, expected, ended in, n, ok
    events: int
    store_rt: Counter[Optional[str]] = field(default_factory=Counter)
    store_rt_events: int = 0
    transport_rt: int = 0
    collections: dict[str, int] = field(default_factory=dict)


def report(console: Console, target: Target, result: Result, workers: int, concurrency: int, models: Path) -> None:
    """Print what the run did: executions per model, round trips, endings, where the data is.
    Kept whole: it is the report's text in the order it is printed, a statement a line."""
    r = result
    secs = max(r.elapsed, 1e-9)
    total = sum(m["executions"] for m in r.per_model.values())
    order = sorted(r.per_model, key=lambda m: (-r.per_model[m]["executions"], m))
    table = Table(
        box=box.SIMPLE_HEAD, title=f"Run {r.run_id}: {total} executions in {r.elapsed:.1f}s", title_justify="left"
    )
    table.add_column("model")
    table.add_column("executions", justify="right")
    table.add_column("events", justify="right")
    table.add_column("events/s", justify="right")
    table.add_column("round trips/event", justify="right")
    for model in order:
        m = r.per_model[model]
        per_event = f"{m['rt'] / m['events']:.1f}" if m["events"] else "-"
        rate = f"{m['events'] / secs:.0f}" if m["events"] else "-"
        table.add_row(model, str(m["executions"]), str(m["events"]), rate, per_event)
    rt_per = f"{r.store_rt_events / r.events:.1f}" if r.events else "-"
    table.add_section()
    table.add_row("all", str(total), str(r.events), f"{r.events / secs:.0f}", rt_per, style="bold")
    console.print()
    console.print(table)

    shop = models.resolve() == default_models_dir().resolve()
    endings(console, r, order, "How the orders and payments ended" if shop else "How the executions ended")

    per_event = f"{r.transport_rt / r.events:.1f} per event" if r.events else ""
    console.print("[bold]Round trips[/] (commands sent to the server)")
    console.print(f"  store, handling events   {r.store_rt_events:>7}   {rt_per} per event: load, commit, relay")
    console.print(f"  store, the demo's runner {r.store_rt.get('driver', 0):>7}   creates, sends, cancels")
    console.print(f"  store, idle workers      {r.store_rt.get(None, 0):>7}   due-timer sweeps between events")
    if r.store_rt.get("sweep"):
        console.print(f"  store, relay sweeps      {r.store_rt['sweep']:>7}   entries no handler relayed")
    console.print(f"  the transport            {r.transport_rt:>7}   {per_event}: publish, claim, ack")
    clock = (
        "a week of shop time ending now: the lost parcels' orders a week back, the rest in the last 25 minutes"
        if shop
        else "an hour ending now; a timer armed past it is left armed"
    )
    console.print(
        f"Worked by {workers} harel AsyncWorker loop(s), up to {concurrency} events in flight each; timers fired "
        f"on a simulated clock ({clock}). Children started inside their parent's relay (pickers, most "
        "payments, in the shop) count their round trips under the parent."
    )
    console.print()
    console.print("[bold]Where the data lives[/]")
    where = f"  server     {target.masked_url}"
    if target.source == SERVER_SOURCE:  # not ours to stop: `harel-beanie server` serves it
        where += f"  (the server `harel-beanie server` runs here, files in {target.data_dir}/db, left running)"
    elif target.embedded:
        where += f"  (embedded SecantusDB, files in {target.data_dir}/db, stopped on exit)"
    console.print(where)
    console.print(f"  database   {target.db}")
    for name, n in r.collections.items():
        console.print(f"  {name:<32} {n} documents")
    if r.earlier:
        runs = ", ".join(r.earlier_runs[-5:]) + (" …" if len(r.earlier_runs) > 5 else "")
        console.print(
            f"  found {r.earlier} executions from earlier runs" + (f" ({runs})" if runs else "") + "; still there"
        )
    else:
        console.print("  no executions from earlier runs: this is the first")
    console.print(f"  this run's ids start with {r.run_id}-")
    console.print()
    console.print("[bold]Look at them[/]")
    for line in look_at_them(target, models):
        console.print(line, markup=False, soft_wrap=True)  # a command to copy: never wrapped


def endings(console: Console, r: Result, order: list[str], title: str) -> None:
    """How the executions ended, by model (status and outcome), and the scenarios' final states."""
    # two words that answer different questions, kept apart: an execution's status (is it
    # still going, did it stop on an error?) and its outcome (what its model's final state
    # says of the business). A declined card is an order DONE with outcome failed.
    ended = Table(box=box.SIMPLE_HEAD, title="Status and outcome, by model", title_justify="left")
    ended.add_column("model")
    ended.add_column("status")
    ended.add_column("outcome (once DONE)")
    for model in order:
        m = r.per_model[model]
        ended.add_row(model, _counted(m["statuses"]), _counted(m["outcomes"]))
    console.print(ended)
    console.print(
        "  status: where an execution is in its life (RUNNING, DONE, FAILED: stopped on an error, to redrive; "
        "CANCELLED). outcome: what its model's final state says of the business. `harel-beanie status` and "
        "the dashboard count statuses: an outcome failed is a DONE execution, not a FAILED one."
    )

    ends = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left")
    ends.add_column("scenario" if title.startswith("How the orders") else "machine")
    ends.add_column("n", justify="right")
    ends.add_column("final state")
    ends.add_column("as the model says?" if title.startswith("How the orders") else "ran without error?")
    for name, expect, got, n, ok in r.endings:
        ends.add_row(name, str(n), got, "[green]yes[/]" if ok else f"[red]no, expected {expect}[/]")
    console.print(ends)


def _counted(counts: Counter[str]) -> str:
    """`27 DONE, 2 RUNNING`: most first."""
    return ", ".join(f"{n} {what}" for what, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or "-"


def look_at_them(target: Target, models: Path) -> list[str]:
    """The commands that show this run, each on a line of its own (to copy) with what it shows
    and the extra it needs on the next: the web dashboard first, the view most people want.
    The models are named by a path that exists wherever the demo ran (the shop models live
    in the installed package, not in the folder the demo ran from); the dashboard draws the
    shop models unless told otherwise, the monitor only the definitions it is given."""
    # in this folder every command finds the embedded server or the one `harel-beanie server` runs
    flags = "" if target.source in ("embedded", SERVER_SOURCE) else f" --url {shlex.quote(target.masked_url)}"
    flags += "" if target.db == DEFAULT_DB else f" --db {shlex.quote(target.db)}"
    definitions = f" --definitions {shlex.quote(_path(models))}"
    shop = models.resolve() == default_models_dir().resolve()
    command = _command()
    return [
        f"  {command} dashboard{flags}{'' if shop else definitions}",
        "      web pages: prints a link to open (pip install 'harel-beanie[dashboard]')",
        f"  {command} status{flags}",
        "      counts, pending work, timers and stuck executions, in the terminal",
        f"  {command} monitor{flags}{definitions}",
        "      harel's terminal UI, statecharts too (pip install 'harel-beanie[tui]')",
    ]


def _path(directory: Path) -> str:
    """`directory` relative to the working directory when it is under it, else absolute."""
    resolved = directory.resolve()
    try:
        return str(resolved.relative_to(Path(os.getcwd()).resolve()))
    except ValueError:
        return str(resolved)


def _command() -> str:
    """How the user can run `harel-beanie` from here: by name if it is on PATH, else by the
    path of the script beside this interpreter (`.venv/bin/harel-beanie` after `make demo`)."""
    if shutil.which("harel-beanie"):
        return "harel-beanie"
    beside = Path(sys.executable).parent / "harel-beanie"
    if not beside.exists():
        return "python -m harel_beanie"
    try:
        return str(beside.relative_to(Path(os.getcwd())))
    except ValueError:
        return str(beside)
