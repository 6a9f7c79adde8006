"""Loading statechart models: every machine of a directory of `*.stm` files, ready to run.

Why this module exists: the `worker`, `monitor`, `dashboard` and `demo` commands all start
from a directory of models, and so do the engine tests and the benchmark; what "loaded"
means is written once here. `load_models(path)` returns every machine of every `*.stm` in
a directory, validated, keyed by definition id, with the directory put on `sys.path` so the
models' dotted action names (`shop_actions.capture`) import, and every action a definition
names imported at once. It runs nothing: the drivers that run loaded models for tests and
the benchmark are in `harel_beanie.harness.drivers`.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Union

from harel.definition.model import Definition
from harel.dsl import definition_from_dsl_file, parse


def default_models_dir() -> Path:
    """The shop models the demo runs, shipped in the package (`harel_beanie/demo/shop_models`;
    `models/` at the top of a checkout points there)."""
    return Path(__file__).resolve().parents[1] / "demo" / "shop_models"


def load_models(path: Union[str, Path, None] = None) -> dict[str, Definition]:
    """Every machine declared in `path`/*.stm (default `models/`), validated, keyed by its
    definition id. Machines a model `import`s come along as its submachines (the runners
    register them under their `alias.Name`). `path` goes on `sys.path` (once) so the action
    modules beside the models import; every action a definition names is imported here, so
    a typo fails at load, not at the first event that reaches it."""
    directory = Path(path) if path is not None else default_models_dir()
    directory = directory.resolve()
    if not directory.is_dir():
        raise FileNotFoundError(f"no models directory at {directory}")
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
        importlib.invalidate_caches()
    registry: dict[str, Definition] = {}
    for stm in sorted(directory.glob("*.stm")):
        for name in parse(stm.read_text()).machines:
            defn = definition_from_dsl_file(stm, name, validate=True)
            if defn.id in registry:
                raise ValueError(f"machine {defn.id!r} is declared twice (again in {stm.name})")
            _import_actions(defn)
            registry[defn.id] = defn
    return registry


def _import_actions(defn: Definition) -> None:
    for d in (defn, *defn.submachines.values()):
        for node in d.index.values():
            refs = [node.on_enter, node.on_exit, node.on_activity]
            refs += [t.selector.action for t in node.transitions if t.selector is not None]
            for ref in refs:
                if ref is not None and isinstance(ref.function, str):
                    module, _, attr = ref.function.rpartition(".")
                    if not callable(getattr(importlib.import_module(module, ref.package), attr, None)):
                        raise ImportError(f"{d.id}: action {ref.function!r} is not a function")
