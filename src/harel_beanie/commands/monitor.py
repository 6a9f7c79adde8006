"""`harel-beanie monitor`: harel's monitoring TUI (`harel[tui]`) over this store.

Why this module exists: harel's `harel monitor` builds its store from `HAREL_STORE_BACKEND`,
so it can only show harel's own stores. The TUI itself takes any `ExecutionStore` through
its read model (`MonitorModel`), so this hands it our sync `MongoStore`: list executions,
drill into one (statechart, timers, outbox, spawns, trace) and use the control plane, on
the data a `demo` or a `worker` left. `--definitions` (or `HAREL_DEFINITIONS_DIR`) gives the
statechart view its machines; without it the monitor shows data only.

`build_app` is separate from `main` so a test can drive the app with Textual's pilot.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from harel_beanie.commands import flags
from harel_beanie.core.errors import ConfigError

if TYPE_CHECKING:
    from harel_beanie.deploy.where import Target

NAME = "monitor"
HELP = "harel's monitoring TUI over the store"
DESCRIPTION = "harel's monitoring TUI (list, detail, control plane) over the store."
WHERE = "embedded"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--definitions",
        metavar="DIR",
        help="*.stm directory for the statechart view (default: $HAREL_DEFINITIONS_DIR; none: data only)",
    )
    p.add_argument(
        "--interval",
        type=flags.positive_float,
        default=None,
        metavar="SECONDS",
        help="refresh interval (default: $HAREL_TUI_INTERVAL_MS, else 1 s)",
    )
    p.add_argument("--theme", default=None, help="a Textual theme (default: $HAREL_TUI_THEME, else nord)")


def definition_source(directory: Optional[str]) -> Any:
    """harel's `DefinitionSource` for the statechart view: every machine in `directory`
    (with the directory importable for the models' actions), or none."""
    from harel.tui.resolve import DefinitionSource

    from harel_beanie.deploy.loader import load_models

    if not directory:
        return DefinitionSource.empty()
    if not Path(directory).is_dir():
        raise ConfigError(f"no definitions directory at {directory}")
    try:
        load_models(directory)  # validates, and puts the directory on sys.path for the actions
        return DefinitionSource.from_dir(directory)
    except Exception as exc:
        raise ConfigError(f"cannot load the definitions in {directory}: {type(exc).__name__}: {exc}") from None


def build_app(
    target: Target, definitions: Optional[str] = None, interval: Optional[float] = None, theme: Optional[str] = None
) -> Any:
    """harel's `MonitorApp` over our `MongoStore` for `target`. Close `app.model` after use."""
    _tui()
    from harel.config import Config
    from harel.tui.app import MonitorApp
    from harel.tui.model import MonitorModel

    from harel_beanie.deploy.stack import open_sync_store

    cfg = Config.from_env()
    source = definition_source(definitions or cfg.definitions_dir)
    store = open_sync_store(target)
    return MonitorApp(
        MonitorModel(store, source),
        interval=interval if interval is not None else cfg.tui_interval_ms / 1000.0,
        theme=theme or cfg.tui_theme,
    )


def check_flags(args: Any) -> None:
    """harel's TUI and `--definitions`, refused before any server starts."""
    _tui()
    if args.definitions and not Path(args.definitions).is_dir():
        raise ConfigError(f"--definitions: no definitions directory at {args.definitions}")


def _tui() -> None:
    try:
        import harel.tui.app  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"the monitor needs harel's TUI ({exc.name} is missing): pip install 'harel-beanie[tui]'"
        ) from None


def main(args: Any, target: Target) -> int:
    app = build_app(target, args.definitions, args.interval, args.theme)
    try:
        app.run()
    finally:
        with contextlib.suppress(Exception):
            app.model.close()
    return 0
