"""The module map in docs/CONTRIBUTING.md stays true: every module of the package is named
there, so a new module cannot land without the sentence that says what it holds."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "harel_beanie"


def test_every_module_is_in_the_contributing_map() -> None:
    text = (ROOT / "docs" / "CONTRIBUTING.md").read_text()
    modules = sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py"))
    assert modules, "no module found: is the package where this test looks?"
    missing = [str(m) for m in modules if f"`{m.name}`" not in text]
    assert not missing, f"modules docs/CONTRIBUTING.md does not map: {missing}"
