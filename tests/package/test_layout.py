"""The tree stays as docs/CONTRIBUTING.md draws it: every module of the package is named in
the section of its folder, so a new module cannot land without the sentence that says what
it holds; and no module of the package or of the benchmark grows past ~400 lines."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "harel_beanie"
MAX_LINES = 400


def _sections(text: str) -> dict[str, str]:
    """The Layout section of CONTRIBUTING, cut at each folder's heading line ("`core/` — ...")."""
    layout = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    parts = re.split(r"(?m)^`([a-z_]+)/` —", layout)
    out = {"": parts[0]}
    for folder, body in zip(parts[1::2], parts[2::2]):
        out[folder] = body
    return out


def test_every_module_is_in_the_contributing_map_under_its_folder() -> None:
    sections = _sections((ROOT / "docs" / "CONTRIBUTING.md").read_text())
    modules = sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py"))
    assert modules, "no module found: is the package where this test looks?"
    missing = []
    for m in modules:
        folder = m.parts[0] if len(m.parts) > 1 else ""
        if f"`{m.name}`" not in sections.get(folder, ""):
            missing.append(str(m))
    assert not missing, f"modules docs/CONTRIBUTING.md does not map under their folder: {missing}"


def test_no_module_is_over_400_lines() -> None:
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
    long = {str(f.relative_to(ROOT)): n for f in files if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by what they hold: {long}"


def test_the_dashboard_page_shows_every_screenshot_with_a_caption() -> None:
    """Each picture `docs/screenshots.py` writes is in docs/ and shown on the manual's dashboard
    page, a one-line caption under it; the pictures the README shows exist."""
    written = re.findall(r'"(dashboard-[a-z]+\.png)"', (ROOT / "docs" / "screenshots.py").read_text())
    assert len(written) >= 5, written
    page = (ROOT / "docs" / "dashboard.md").read_text()
    for name in written:
        assert (ROOT / "docs" / name).is_file(), name
        shown = re.search(rf"!\[[^\]]+\]\({re.escape(name)}\)\n\*[^*\n]+\*\n", page)
        assert shown, f"docs/dashboard.md does not show {name} with a caption line under it"
    readme_pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (ROOT / "README.md").read_text())
    assert readme_pictures, "the README shows no screenshot"
    missing = [p for p in readme_pictures if not (ROOT / p).is_file()]
    assert not missing, f"pictures the README shows that do not exist: {missing}"


#: A function over this many lines says why in its docstring ("Kept whole: ...").
LONG_FUNCTION = 50
#: No function is over this many lines.
MAX_FUNCTION = 80


def _functions() -> list[tuple[str, str, int, str]]:
    import ast

    found = []
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "bench").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append((str(path.relative_to(ROOT)), node.name, lines, ast.get_docstring(node) or ""))
    return found


def test_no_function_is_over_80_lines_and_a_long_one_says_why() -> None:
    over = [f"{path}: {name} ({n} lines)" for path, name, n, _ in _functions() if n > MAX_FUNCTION]
    assert not over, f"split these: {over}"
    silent = [
        f"{path}: {name} ({n} lines)"
        for path, name, n, doc in _functions()
        if n > LONG_FUNCTION and "Kept whole:" not in doc
    ]
    assert not silent, f"split these, or say in the docstring why each is kept whole ('Kept whole: ...'): {silent}"
