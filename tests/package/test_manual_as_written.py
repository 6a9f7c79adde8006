"""The manual tested as written: every fenced `python` and shell block of README.md and of each
page under docs/ runs as printed, in an empty folder against the embedded server, or carries
the fragment marker `<!-- fragment: the reason -->` on the line directly above its fence. What
a block is, which languages run, and what the script changes (everything else runs as printed)
is in `tests/support/manual_pages.py`. Blocks of other languages are not code to run: the data
blocks (`toml`, `json`, `yaml`) must parse, and `text`, `mermaid`, `promql`, `ini` and the like
are read by people only. A fence naming no language is refused (the test cannot tell what it is).

A page's test fails when a block is neither run nor marked, when a marker gives no reason, when
a block fails, or when a page misses what it is known to print (`PRINTS`).

A second test reads every page of the manual: each path, `harel-beanie` command and flag,
`make` target and test file it names (code spans and code blocks included) must exist.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harel_beanie.deploy.embedded import free_port
from tests.commands.test_cli import cli_env
from tests.support.manual_pages import (
    PRELUDE,
    PYTHON_RUNNER,
    RUNNABLE,
    Block,
    extra_plugins,
    page_blocks,
    problems,
    runs_server,
    shell_lines,
    shell_script,
)

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def pages() -> list[str]:
    """README.md and every page under docs/, as paths from the repository's root."""
    return ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]


#: what a page is known to print when it runs, beside its blocks' exit codes
PRINTS: dict[str, list[str]] = {
    "README.md": ["Run demo-", "How the orders and payments ended", "open http://127.0.0.1:"],
    "docs/getting-started.md": [
        "Run demo-",
        "How the orders and payments ended",  # the demo
        "Nothing stuck",  # status after it
        "open http://127.0.0.1:",  # the dashboard's link
        "export MONGODB_URL=mongodb://127.0.0.1:",  # the server
        "layout version",  # migrate status, on the server the export named
        "failed orders: []",  # the typed query, first thing after the lifespan opened the store
    ],
    # the page's own test file, in memory and on the server
    "docs/testing.md": ["2 passed"],
}


def run_page(tmp_path: Path, found: list[Block]) -> subprocess.CompletedProcess[str]:
    """The page's runnable blocks in an empty folder: its files written, its shell blocks, then
    its Python blocks (while a `harel-beanie server` the page started still serves)."""
    ports = {"server": free_port(), "dashboard": free_port(), "reader": free_port()}
    home, reader = tmp_path / "empty", tmp_path / "reader"
    home.mkdir()
    reader.mkdir()
    runnable = [b for b in found if b.lang in RUNNABLE and b.fragment is None]
    for b in runnable:
        if b.file:
            (home / b.file).parent.mkdir(parents=True, exist_ok=True)
            (home / b.file).write_text(b.body)
    script = shell_script(runnable, ports, reader, reader_server=not runs_server(runnable))
    python = [(b.line, b.body) for b in runnable if b.lang == "python" and not b.file]
    if python:
        (tmp_path / "blocks.json").write_text(json.dumps(python))
        (tmp_path / "blocks.py").write_text(PYTHON_RUNNER)
        # the Python blocks run where the page puts them: after its shell blocks, in the same
        # shell, reading the MONGODB_URL it has
        script += f'MONGODB_URL="$MONGODB_URL" python "{tmp_path / "blocks.py"}" "{tmp_path / "blocks.json"}"\n'
    env = cli_env()
    env.pop("MONGODB_URL", None)  # the reader's terminal: only what the page sets
    # pytest as in the reader's environment: the plugins the package and its testing extra bring
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PYTEST_PLUGINS"] = ",".join(extra_plugins(ROOT / "pyproject.toml"))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=home,
        env=env,
        stdin=subprocess.DEVNULL,  # no terminal: a command that would ask does not wait for an answer
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        # the script's own clean-up did not run: stop what it started as it would (SIGTERM:
        # the serving commands stop their servers), then for good
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        err += "\n(timed out after 600 s)"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    )
    return proc.stdout


@pytest.mark.parametrize("page", pages())
def test_every_block_of_the_page_runs_as_printed_or_is_a_marked_fragment(page: str, tmp_path: Path) -> None:
    found = page_blocks((ROOT / page).read_text())
    assert not problems(found), f"{page}:\n" + "\n".join(problems(found))
    runnable = [b for b in found if b.lang in RUNNABLE and b.fragment is None]
    if not runnable:
        assert page not in PRINTS
        return
    out = _ok(run_page(tmp_path, found))
    for b in runnable:
        if b.lang == "python" and not b.file:
            assert f"python block at line {b.line}: ran" in out, out
    for printed in PRINTS.get(page, []):
        assert printed in out, f"{page} did not print {printed!r}:\n{out[-6000:]}"


# --- every name the manual gives exists ----------------------------------------------------

#: a path the manual names: under one of the repository's folders, or a top-level file
PATH = re.compile(
    r"(?<![\w./-])((?:docs|tests|src|bench|migrations|models)/[\w./*-]*[\w/*]|"
    r"(?:Makefile|MANIFEST\.in|pyproject\.toml|mkdocs\.yml|CHANGELOG\.md|README\.md))(?:::(\w+))?"
)
COMMAND = re.compile(r"harel-beanie ([a-z][a-z-]*)((?:[ \t]+[^\s`|;&)]+)*)")
MAKE = re.compile(r"(?<![\w-])make ([a-z][a-z-]*)")
#: names that look like paths and are not this repository's
NOT_OURS = {"docs/api", "src/harel_beanie.egg"}


def manual() -> dict[str, str]:
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return {str(p.relative_to(ROOT)): p.read_text() for p in pages}


def code_of(text: str) -> list[str]:
    """The code the page shows: its fenced blocks and its inline code spans."""
    fenced = [b.body for b in page_blocks(text)]
    spans = re.findall(r"`([^`\n]+)`", FENCE.sub("", text))
    return fenced + spans


def _command_flags() -> dict[str, set[str]]:
    import argparse

    from harel_beanie.commands.cli import build_parser

    parser = build_parser()
    out: dict[str, set[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[name] = {o for a in sub._actions for o in a.option_strings}
    return out


def test_every_path_command_flag_and_target_the_manual_names_exists() -> None:
    flags = _command_flags()
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    missing: list[str] = []
    named = {"paths": 0, "commands": 0, "targets": 0}
    for page, text in manual().items():
        if page.startswith("docs/reliability/") or page == "CHANGELOG.md":
            continue  # records of past runs and releases: they name what was there then
        for code in code_of(text):
            for path, test in PATH.findall(code):
                named["paths"] += 1
                path = path.rstrip(".")
                if path in NOT_OURS or "<" in path:
                    continue
                where = ROOT / path
                if "*" in path:  # a pattern: it names at least one file
                    if not list(ROOT.glob(path)):
                        missing.append(f"{page}: {path}")
                elif not where.exists() and not (ROOT / "docs" / path).exists():
                    missing.append(f"{page}: {path}")
                elif test and f"def {test}(" not in where.read_text():
                    missing.append(f"{page}: {path}::{test}")
            for command, rest in COMMAND.findall(code):
                named["commands"] += 1
                if command not in flags:
                    if command not in ("data",):  # ./harel-beanie-data
                        missing.append(f"{page}: harel-beanie {command}")
                    continue
                for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest):
                    if flag not in flags[command] and flag not in ("--help", "--version"):
                        missing.append(f"{page}: harel-beanie {command} {flag}")
            for target in MAKE.findall(code):
                named["targets"] += 1
                if target not in targets:
                    missing.append(f"{page}: make {target}")
    assert min(named.values()) > 5, named  # the reader finds what the pages name
    assert not missing, "the manual names what does not exist:\n" + "\n".join(sorted(set(missing)))


@pytest.mark.parametrize(
    "text,found",
    [
        ("see `tests/doors/test_doors.py::test_x` and tests/nope.py", [("tests/doors/test_doors.py", "test_x")]),
        ("`harel-beanie prune --finished-before 7d --bogus`", []),
    ],
)
def test_the_reader_finds_paths_in_code(text: str, found: list[tuple[str, str]]) -> None:
    assert [m for code in code_of(text) for m in PATH.findall(code)] == found


# --- how a page's blocks are read ------------------------------------------------------------

PAGE = """Intro.

<!-- fragment: needs your app's own store -->
```python
app.include_router(router)
```

1. A step:

   ```sh
   harel-beanie migrate status
   ```

```console
$ harel-beanie status
Executions
```

```toml
[tool.x]
a = 1
```
"""


def test_a_pages_blocks_are_read_with_their_markers_and_indents() -> None:
    found = page_blocks(PAGE)
    assert [(b.lang, b.fragment) for b in found] == [
        ("python", "needs your app's own store"),
        ("sh", None),
        ("console", None),
        ("toml", None),
    ]
    assert found[1].body == "harel-beanie migrate status\n"  # dedented under its list item
    assert shell_lines(found[2]) == ["harel-beanie status"]  # the command, not its output
    assert not problems(found)


@pytest.mark.parametrize(
    "text,problem",
    [
        ("```\nls\n```\n", "names no language"),
        ("<!-- fragment: -->\n```python\nx\n```\n", "without its reason"),
        ("<!-- fragment (needs your app) -->\n```python\nx\n```\n", "without its reason"),
        ("```toml\n[a\n```\n", "does not parse"),
        ("```json\n{'a': 1}\n```\n", "does not parse"),
    ],
)
def test_a_block_the_test_cannot_take_is_refused(text: str, problem: str) -> None:
    assert any(problem in p for p in problems(page_blocks(text))), problems(page_blocks(text))


def test_a_marker_counts_only_directly_above_its_fence() -> None:
    [block] = page_blocks("<!-- fragment: a reason -->\n\n```sh\nls\n```\n")
    assert block.fragment is None  # a blank line between: the block runs


def test_a_python_block_naming_a_file_is_that_file() -> None:
    conftest, code = page_blocks("```python\n# conftest.py\nx = 1\n```\n\n```python\n# a comment\nx = 1\n```\n")
    assert (conftest.file, code.file) == ("conftest.py", None)


def test_pytest_in_a_page_loads_only_the_plugins_the_testing_extra_brings() -> None:
    plugins = extra_plugins(ROOT / "pyproject.toml")
    assert "pytest_asyncio.plugin" in plugins  # harel_async_store needs it
    assert not [p for p in plugins if p.startswith(("xdist", "_hypothesis", "schemathesis"))], plugins


def test_a_serving_command_that_stops_on_its_own_within_its_block_fails_the_page(tmp_path: Path) -> None:
    """A command that printed its ready line and then stopped with an error (its port taken
    after its link was printed, say) is not taken as served: the page fails, its output shown."""
    script = "\n".join(
        [*PRELUDE, "_bg block ready bash -c 'echo ready; sleep 0.2; echo address in use; exit 3'", "sleep 2"]
    )
    done = subprocess.run(["bash", "-c", script + "\nstop block\n"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "exit 3" in done.stderr and "address in use" in done.stderr, done
    served = subprocess.run(
        ["bash", "-c", "\n".join([*PRELUDE, "_bg block ready bash -c 'echo ready; exec sleep 30'", "stop block"])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert served.returncode == 0, served  # stopped by the harness at its block's end: served
