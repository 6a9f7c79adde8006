"""Every dotted `harel_beanie...` path the manual names can be imported: README.md,
CHANGELOG.md and every page under docs/ (the templates of generated pages included). Modules
move; a page that still names the old path would send a reader to an ImportError, so a move
that leaves one behind fails here, with the list of stale paths and where each is named."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOTTED = re.compile(r"(?<![\w./-])harel_beanie(?:\.[A-Za-z_]\w*)+")


def manual_pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def named_paths(text: str) -> set[str]:
    return set(DOTTED.findall(text))


def resolves(dotted: str) -> bool:
    """Whether `dotted` is a module, or an attribute (at any depth) of the longest module
    prefix of it. A module that exists but fails to import for a missing dependency raises:
    that is a broken environment, not a stale page."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
                continue  # this prefix is not a module: try a shorter one
            raise
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_the_pattern_finds_dotted_paths_and_nothing_else() -> None:
    text = (
        "`harel_beanie.queries.failed_since(...)`, harel_beanie.transport.bind_queues(prefix), "
        "ends a sentence: harel_beanie.testing. Not: harel-beanie.json, src/harel_beanie.egg, "
        "harel_beanie:node:0001, plain harel_beanie"
    )
    assert named_paths(text) == {
        "harel_beanie.queries.failed_since",
        "harel_beanie.transport.bind_queues",
        "harel_beanie.testing",
    }


def test_resolves_tells_a_moved_path_from_a_present_one() -> None:
    assert resolves("harel_beanie.queries")
    assert resolves("harel_beanie.queries.ExecutionFilter")
    assert resolves("harel_beanie.MongoStore.from_url")
    assert not resolves("harel_beanie.no_such_module")
    assert not resolves("harel_beanie.queries.no_such_query")


def test_every_dotted_path_in_the_manual_imports() -> None:
    pages = manual_pages()
    assert len(pages) > 10, "no pages found: is docs/ where this test looks?"
    stale: dict[str, list[str]] = {}
    for page in pages:
        if not page.is_file():
            continue
        for dotted in named_paths(page.read_text()):
            if not resolves(dotted):
                stale.setdefault(dotted, []).append(str(page.relative_to(ROOT)))
    assert not stale, "paths the manual names that do not import (moved? renamed?): " + "; ".join(
        f"{p} in {', '.join(sorted(where))}" for p, where in sorted(stale.items())
    )
