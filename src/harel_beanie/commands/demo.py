"""`harel-beanie demo`: the shop models shipped in the package (or a user's own, `--models`),
run through harel's engine on the store, then summarised (the runs themselves are
`harel_beanie.demo.run`'s and `harel_beanie.demo.explore`'s).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harel_beanie.commands import flags
from harel_beanie.core.errors import ConfigError

if TYPE_CHECKING:
    from harel_beanie.deploy.where import Target

NAME = "demo"
HELP = "run the shop models shipped in the package (or your own, --models) through harel's engine on the store"
DESCRIPTION = (
    "Run the shop's statechart workloads (orders, payments, pickers; shipped in the package) through harel's "
    "AsyncWorker and this package's transport (--transport harel: harel's Mongo transport) on the store, then "
    "summarise; --models DIR runs your own *.stm models instead. With no URL, starts an embedded server whose "
    "data stays in ./harel-beanie-data; a run that finds an earlier one interrupted there starts over (--fresh "
    "asks for it)."
)
WHERE = "embedded"
#: with no URL it starts the embedded server on a new data folder: the run is what fills it
MAKES_DATA = True
#: what it says about the embedded server belongs in its report, on stdout
NOTES_ON_STDOUT = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    # `--model` (a typo) must not be taken for `--models`, nor `--fr` for `--fresh`
    p.allow_abbrev = False
    p.add_argument(
        "-n",
        "--executions",
        type=flags.positive_int,
        default=300,
        metavar="N",
        help="about how many executions to run (default 300)",
    )
    p.add_argument("--workers", type=flags.positive_int, default=2, help="AsyncWorker loops (default 2)")
    p.add_argument(
        "--concurrency", type=flags.positive_int, default=16, help="events in flight per worker (default 16)"
    )
    p.add_argument(
        "--models",
        metavar="DIR",
        help="a directory of your own *.stm models to run instead: executions of each machine, driven with "
        "events their transitions accept (default: the shop models shipped in the package)",
    )
    p.add_argument("--no-trace", action="store_true", help="do not record the execution timelines")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="start over: drop the demo's database first (a run that finds an interrupted one in its own "
        "data folder does so by itself)",
    )
    flags.transport(p, idle_wait=False)


def check_flags(args: Any) -> None:
    """`--models`, refused before the embedded server starts (it takes seconds): a folder of
    `*.stm` models that load (parse, validate, import their actions)."""
    if args.models is not None:
        models = Path(args.models)
        if not models.is_dir():
            raise ConfigError(f"--models: no models directory at {models}")
        if not any(models.glob("*.stm")):
            raise ConfigError(f"--models: no *.stm models in {models}")
        from harel_beanie.deploy.loader import load_models  # harel's parser: only once there are models to read

        try:
            load_models(models)
        except Exception as exc:  # a model that does not parse, validate or find its actions: the user's to fix
            said = " ".join(str(exc).split())  # harel's list of problems, on the one line
            raise ConfigError(f"--models: the models in {models} do not load: {type(exc).__name__}: {said}") from None


def main(args: Any, target: Target) -> int:
    """Run the demo against `target` (see `harel_beanie.commands.cli` for the flags)."""
    import asyncio

    from pymongo.errors import ConnectionFailure
    from rich.console import Console
    from rich.markup import escape

    from harel_beanie.demo.explore import Explore
    from harel_beanie.demo.report import report
    from harel_beanie.demo.run import Demo, DemoServerLost
    from harel_beanie.deploy.loader import default_models_dir
    from harel_beanie.deploy.stack import TRANSPORTS

    check_flags(args)
    # piped or captured, rich would use 80 columns too: the tables are made to fit them
    console = Console(highlight=False)
    models = Path(args.models) if args.models else default_models_dir()
    kind = args.transport or os.environ.get("HAREL_BEANIE_TRANSPORT") or TRANSPORTS[0]
    shop = models.resolve() == default_models_dir().resolve()
    settings = dict(trace=not args.no_trace, transport=kind, fresh=args.fresh)
    if shop:
        demo: Demo = Demo(target, models, args.executions, args.workers, args.concurrency, console, **settings)
    else:
        demo = Explore(target, models, args.executions, args.workers, args.concurrency, console, **settings)
    what = "the shop's models" if shop else f"the models in {escape(_short(models))}"
    console.print(f"[bold]harel-beanie demo[/] {demo.run_id}: about {demo.planned} executions of {what}")
    on = "this package's transport" if kind == "beanie" else "harel's Mongo transport"
    console.print(f"  on {escape(target.masked_url)}, database {target.db}")
    console.print(f"  harel's AsyncWorker on {on}")
    try:
        result = asyncio.run(demo.run())
    except ConnectionFailure as exc:
        server = "the embedded server" if target.embedded else f"the server at {target.masked_url}"
        raise DemoServerLost(
            f"{server} stopped answering mid-run ({type(exc).__name__}): run `harel-beanie demo` again "
            "(it starts over where a run was interrupted)"
        ) from None
    report(console, target, result, args.workers, args.concurrency, models)
    return 0 if all(ok for *_, ok in result.endings) else 1


def _short(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path(os.getcwd()).resolve())) + "/"
    except ValueError:
        return str(path)
