"""docs/RELIABILITY.md is what docs/reliability.py renders from the recorded runs
(docs/reliability/*.json), its template and the tests' docstrings, to the byte: a hand edit
of the page, or a docstring or template changed without rendering again, fails here. Only
renders (no test runs): the figures themselves come from `make reliability`, which records
them at the commit it names and refuses a tree with uncommitted changes."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reliability() -> Iterator[ModuleType]:
    """docs/reliability.py, imported as a module (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location("hb_docs_reliability", ROOT / "docs" / "reliability.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and the like look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_the_committed_page_is_the_render_of_the_recorded_runs(reliability: ModuleType) -> None:
    rendered = reliability.render(reliability.load_runs())
    committed = reliability.OUTPUT.read_text(encoding="utf-8")
    if committed != rendered:
        first = next(
            (n for n, (a, b) in enumerate(zip(committed.splitlines(), rendered.splitlines()), 1) if a != b),
            min(len(committed.splitlines()), len(rendered.splitlines())) + 1,
        )
        pytest.fail(
            f"docs/RELIABILITY.md differs from the render of docs/reliability/*.json from line {first} on. The page "
            "is generated: put prose in docs/reliability/template.md or the test's docstring, then "
            "`python docs/reliability.py --render`; figures come only from `make reliability`.",
            pytrace=False,
        )


def test_a_run_older_than_the_tests_is_shown_as_such(reliability: ModuleType) -> None:
    """A recorded default run holding every current default test under its current id says
    nothing is missing; one test function taken out of it, and one id renamed, are both named
    on the page."""
    tests = reliability.current_tests()
    run: dict[str, Any] = {"tests": {name: {"outcome": "passed"} for name, f in tests.items() if not f["soak"]}}
    soak: dict[str, Any] = {"tests": {name: {"outcome": "passed"} for name, f in tests.items() if f["soak"]}}
    assert reliability.staleness({"default": run, "soak": soak}).startswith("Every current test")
    older = copy.deepcopy(run)
    dropped = "tests/reliability/test_reliability_partitions.py::test_the_takeover_reading_can_fail"
    assert older["tests"].pop(dropped)
    older["tests"]["tests/test_reliability_gone.py::test_moved[x]"] = {"outcome": "passed"}
    said = reliability.staleness({"default": older, "soak": soak})
    assert "not in the recorded default run" in said and "`test_the_takeover_reading_can_fail`" in said, said
    assert "`tests/test_reliability_gone.py` (all 1)" in said, said


def test_a_run_is_refused_while_its_sources_have_uncommitted_changes(
    reliability: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """With a change to src/ not committed, `make reliability` runs no test and writes
    nothing: its figures would name a commit they were not run at."""
    monkeypatch.setattr(reliability, "uncommitted", lambda: [" M src/harel_beanie/core/counting.py"])
    ran: list[Any] = []
    monkeypatch.setattr(reliability, "run_tests", lambda *a: ran.append(a))
    monkeypatch.setattr(reliability, "OUTPUT", tmp_path / "RELIABILITY.md")
    assert reliability.main([]) == 2
    assert not ran and not (tmp_path / "RELIABILITY.md").exists()
    assert "counting.py" in capsys.readouterr().err
