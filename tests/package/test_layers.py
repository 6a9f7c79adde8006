"""The layers hold by every means of import, and `core/` stays free of I/O.

`lint-imports` (pyproject.toml's contracts) sees `import` statements. What it cannot see is
an import by name at run time (`importlib.import_module`, `__import__`): these tests read
every module for those and hold each to the same layers, and they plant an upward import,
static and dynamic, in a copy of the package to see both checks fail on it.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "harel_beanie"

#: Calls that import by name at run time.
DYNAMIC = {"import_module", "__import__"}

#: Run-time imports whose target is not a literal, each with why it crosses no layer.
NOT_LITERAL = {
    # the actions a user's models name, from the models' own directory: never this package
    "deploy/loader.py",
    # the package's face loads each public name on first use from its table (`_WHERE`); the
    # face sits above every layer, and its TYPE_CHECKING block names the same modules statically
    "__init__.py",
}

#: What `core/` may take from the driver: its errors, and the index declarations of the schema.
CORE_MAY_IMPORT = {"pymongo.errors", "pymongo:ASCENDING", "pymongo:DESCENDING", "pymongo:IndexModel"}
#: Modules that would put I/O in `core/`.
CORE_MUST_NOT_IMPORT = ("pymongo", "motor", "socket", "subprocess", "asyncio", "httpx", "urllib.request", "requests")


def _layers() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    return [[part.strip() for part in layer.split("|")] for layer in layers]


def _layer_of(module: str, layers: list[list[str]]) -> int | None:
    for depth, layer in enumerate(layers):
        if any(module == p or module.startswith(p + ".") for p in layer):
            return depth
    return None


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def dynamic_import_problems(package: Path) -> list[str]:
    """Each run-time import in `package` that reaches a higher layer, or a sibling it may not
    know, or whose target cannot be read (not a literal, not listed in NOT_LITERAL)."""
    layers = _layers()
    problems = []
    for path in sorted(package.rglob("*.py")):
        rel = str(path.relative_to(package))
        source = _module_name(path, package)
        here = _layer_of(source, layers)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name not in DYNAMIC or not node.args:
                continue
            arg = node.args[0]
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                if rel not in NOT_LITERAL:
                    problems.append(f"{rel}:{node.lineno}: {name}() of a name that cannot be checked")
                continue
            target = arg.value
            there = _layer_of(target, layers)
            if here is None or there is None:
                continue
            sibling = here == there and not any(
                source.startswith(p) and target.startswith(p) for p in layers[here] if p
            )
            if there < here or sibling:
                problems.append(f"{rel}:{node.lineno}: {source} imports {target} by name, a layer it may not know")
    return problems


def core_io_problems(package: Path) -> list[str]:
    """Each import in `core/` of something that does I/O."""
    problems = []
    for path in sorted((package / "core").rglob("*.py")):
        rel = str(path.relative_to(package))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = (
                    [node.module] if node.module in CORE_MAY_IMPORT else [f"{node.module}:{a.name}" for a in node.names]
                )
            else:
                continue
            for target in targets:
                if target in CORE_MAY_IMPORT:
                    continue
                module = target.split(":")[0]
                if any(module == bad or module.startswith(bad + ".") for bad in CORE_MUST_NOT_IMPORT):
                    problems.append(f"{rel}:{node.lineno}: imports {target}")
    return problems


def test_no_module_imports_a_higher_layer_by_name() -> None:
    assert not dynamic_import_problems(PACKAGE)


def test_core_imports_nothing_that_does_io() -> None:
    assert not core_io_problems(PACKAGE)


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(PACKAGE, tmp_path / "harel_beanie", ignore=shutil.ignore_patterns("static", "templates"))
    return tmp_path / "harel_beanie"


def _plant(module: Path, line: str) -> None:
    module.write_text(module.read_text() + f"\n\ndef _planted() -> None:\n    {line}\n")


def test_a_planted_dynamic_upward_import_is_caught(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    _plant(copy / "core" / "keys.py", 'importlib.import_module("harel_beanie.commands.cli")')
    _plant(copy / "store" / "settings.py", '__import__("harel_beanie.dashboard")')
    found = dynamic_import_problems(copy)
    assert any("core/keys.py" in p for p in found) and any("store/settings.py" in p for p in found), found


def test_a_planted_io_import_in_core_is_caught(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    _plant(copy / "core" / "keys.py", "from pymongo import MongoClient")
    assert any("MongoClient" in p for p in core_io_problems(copy))


@pytest.mark.skipif(
    shutil.which("lint-imports", path=str(Path(sys.executable).parent)) is None, reason="no lint-imports"
)
def test_lint_imports_fails_on_a_planted_static_upward_import(tmp_path: Path) -> None:
    """The contracts are kept on the package as it is, and broken once `core/` imports the
    command line."""
    lint = str(Path(sys.executable).parent / "lint-imports")
    config = tmp_path / "contracts.toml"
    config.write_text((ROOT / "pyproject.toml").read_text())
    copy = _copy(tmp_path / "src")
    env = {"PYTHONPATH": str(tmp_path / "src"), "PATH": str(Path(sys.executable).parent)}
    kept = subprocess.run(
        [lint, "--config", str(config), "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert kept.returncode == 0, kept.stdout[-2000:]
    (copy / "core" / "keys.py").write_text(
        (copy / "core" / "keys.py").read_text() + "\nfrom harel_beanie.commands import cli\n"
    )
    broken = subprocess.run(
        [lint, "--config", str(config), "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert broken.returncode != 0 and "harel_beanie.core.keys -> harel_beanie.commands.cli" in broken.stdout, (
        broken.stdout[-2000:]
    )
