"""The manual tested as written: docs/getting-started.md and README.md's quick start run in an
empty folder, their shell blocks line by line and their Python blocks after them.

What is changed, and why, is all here (everything else runs as printed):

- a `pip install` line is skipped: the package under test is installed already (its
  commands on PATH, beside this interpreter);
- `harel-beanie demo` gets `-n 24` (a small run: every kind of ending, in seconds);
- the two fixed ports are moved to free ones, so two runs of the suite on one machine do not
  collide: `harel-beanie server` (27018 in the text, and in the `export MONGODB_URL=` line that
  repeats what it printed) and `harel-beanie dashboard` (8000);
- a command that serves until stopped (`server`, `dashboard`, `worker`) runs in the
  background until its ready line is printed, and is stopped at the end of its block,
  `server` at the end of the page (it is "in a terminal of its own"), by SIGTERM, which each
  of them handles as Ctrl-C (a background job of a script ignores SIGINT);
- the Python blocks run in one process, one namespace, in the page's order (a later block
  uses what an earlier one defined), top-level `await` on one event loop, with the names a
  reader's own app brings defined first (`Order`, `definitions`, `stop_event` already set,
  `app`, `require_staff`). They read `MONGODB_URL` as the page says: the embedded server
  `harel-beanie server` started (getting-started), or the test session's (README).

A second test reads every page of the manual: each path, `harel-beanie` command and flag,
`make` target and test file it names (code spans and code blocks included) must exist.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harel_beanie.deploy.embedded import free_port
from tests.commands.test_cli import cli_env

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
#: commands that serve until stopped, and the line each prints once it serves
SERVING = {"server": "export MONGODB_URL=", "dashboard": "open http://", "worker": " ready: "}


def blocks(text: str) -> list[tuple[str, str]]:
    """The fenced blocks of `text`: (language, body), in order."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def section(text: str, heading: str) -> str:
    """From `heading` to the next heading of its level or above."""
    start = text.index(heading)
    level = heading.split(" ", 1)[0]
    rest = text[start + len(heading) :]
    end = re.search(rf"^#{{1,{len(level)}}} ", rest, re.M)
    return heading + (rest[: end.start()] if end else rest)


def shell_script(lines_of_blocks: list[str], ports: dict[str, int]) -> str:
    """The blocks as one bash script, changed only as the module's docstring says."""
    out = [
        "set -euo pipefail",
        'BG="$(mktemp -d)"; touch "$BG/block" "$BG/page"',
        # stop serving commands as Ctrl-C does, and wait for them (their servers stop with them;
        # 60 s at most each, then SIGKILL)
        'stop() { for pid in $(cat "$BG/$1"); do kill -TERM "$pid" 2>/dev/null || true; done;'
        '  for pid in $(cat "$BG/$1"); do for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1;'
        '  done; kill -KILL "$pid" 2>/dev/null || true; done; : > "$BG/$1"; }',
        "trap 'stop block; stop page' EXIT",
        # run a serving command in the background until it prints its ready line (60 s at most)
        '_bg() { local life=$1 ready=$2; shift 2; local log="$BG/$RANDOM.log"; "$@" > "$log" 2>&1 &'
        '  local pid=$!; echo "$pid" >> "$BG/$life";'
        '  for _ in $(seq 600); do if grep -q -- "$ready" "$log"; then cat "$log"; return 0; fi;'
        '    if ! kill -0 "$pid" 2>/dev/null; then cat "$log"; echo "exited before: $ready" >&2; return 1; fi;'
        '    sleep 0.1; done; cat "$log"; return 1; }',
    ]
    for block in lines_of_blocks:
        for raw in block.splitlines():
            line = raw.split("  #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
            if not line or line.startswith("pip install"):
                continue
            line = line.replace("127.0.0.1:27018", f"127.0.0.1:{ports['server']}")
            words = line.split()
            if words[:2] == ["harel-beanie", "demo"]:
                line += " -n 24"
            if words[:1] == ["harel-beanie"] and len(words) > 1 and words[1] in SERVING:
                command = words[1]
                if command == "server":
                    line += f" --port {ports['server']}"
                if command == "dashboard":
                    line += f" --port {ports['dashboard']}"
                life = "page" if command == "server" else "block"
                line = f"_bg {life} {json.dumps(SERVING[command])} {line}"
            out.append(f"echo {shlex.quote('$ ' + raw.strip())}")
            out.append(line)
        out.append("stop block")
    return "\n".join(out) + "\n"


PRELUDE = """
import asyncio, json, os, sys
from beanie import Document
from fastapi import FastAPI
from harel_beanie.dashboard import no_auth
from harel_beanie.deploy import default_models_dir, load_models

class Order(Document):  # a reader's own Beanie document
    sku: str = ""

definitions = load_models(default_models_dir())  # the reader's machines: the shop's
stop_event = asyncio.Event()
stop_event.set()  # a worker started by a snippet claims, finds it set, and stops
app = FastAPI()
require_staff = no_auth
loop = asyncio.new_event_loop()
asyncio.set_event_loop(loop)
namespace = dict(globals())
for i, source in enumerate(json.load(open(sys.argv[1]))):
    code = compile(source, f"block {i + 1}", "exec", flags=__import__("ast").PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, namespace)
    if asyncio.iscoroutine(result):
        loop.run_until_complete(result)
    print(f"block {i + 1}: ran")
"""


def run_page(
    tmp_path: Path, shell: list[str], python: list[str], env_url: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The page's shell blocks, then its Python blocks (while `harel-beanie server` still
    serves), in an empty folder."""
    ports = {"server": free_port(), "dashboard": free_port()}
    (tmp_path / "blocks.json").write_text(json.dumps(python))
    (tmp_path / "blocks.py").write_text(PRELUDE)
    script = shell_script(shell, ports)
    # the Python blocks run where the page puts them: after its shell blocks, in the same shell
    run_python = f'python "{tmp_path / "blocks.py"}" "{tmp_path / "blocks.json"}"'
    if env_url is not None:
        run_python = f"MONGODB_URL={env_url} {run_python}"
    script += run_python + "\n"
    home = tmp_path / "empty"
    home.mkdir()
    env = cli_env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=home,
        env=env,
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


def test_getting_started_runs_as_written_from_an_empty_folder(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "getting-started.md").read_text()
    found = blocks(page[: page.index("## From a clone of the repository")])  # the clone's `make` is the README's
    shell = [body for lang, body in found if lang == "sh"]
    python = [body for lang, body in found if lang == "python"]
    assert len(shell) >= 4 and len(python) == 3, found
    out = _ok(run_page(tmp_path, shell, python))
    # what each step printed, as a new user reads it
    assert "Run demo-" in out and "How the orders and payments ended" in out  # the demo
    assert "Executions" in out and "Nothing stuck" in out  # status after it
    assert "open http://127.0.0.1:" in out  # the dashboard's link
    assert "export MONGODB_URL=mongodb://127.0.0.1:" in out  # the server
    assert re.search(r"worker \S+ ready: mongodb://127\.0\.0\.1:\d+ database harel", out), out
    assert "layout version" in out  # migrate status, on the server the export named
    assert "block 1: ran" in out and "block 2: ran" in out and "block 3: ran" in out
    assert "failed orders: []" in out  # the typed query, first thing after the lifespan opened the store
    assert (tmp_path / "empty" / "my-shop" / "harel-beanie-data" / "db").is_dir()


def test_the_readmes_quick_start_runs_as_written_from_an_empty_folder(tmp_path: Path, mongo_url: str) -> None:
    readme = (ROOT / "README.md").read_text()
    quick = blocks(section(readme, "## Quick start"))
    shell = [body for lang, body in quick if lang == "sh"]
    python = [body for lang, body in blocks(readme) if lang == "python"]
    assert len(shell) == 1 and len(python) >= 3
    out = _ok(run_page(tmp_path, shell, python, env_url=mongo_url))
    assert "Run demo-" in out and "open http://127.0.0.1:" in out
    assert all(f"block {i + 1}: ran" in out for i in range(len(python))), out


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
    fenced = [body for _, body in blocks(text)]
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
