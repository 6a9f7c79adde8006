"""The manual's pages as a reader runs them: their fenced blocks collected, each either run or
marked as a fragment, and the runnable ones turned into one bash script per page.

What a page is taken to mean, and what the script changes (everything else runs as printed):

- a block is a fence (``` at the start of a line, or indented under a list item) naming its
  language; `python` and the shell languages (`sh`, `bash`, `shell`, `console`: of a
  `console` block only its `$ ` lines) are code to run. A block that cannot run as printed
  carries `<!-- fragment: the reason -->` on the line directly above its fence, and is not
  run. Other languages are not code to run: `toml` and `json` blocks must parse, `yaml` too;
  `text`, `mermaid`, `promql`, `ini` and the rest are read by people only;
- a `python` block whose first line is a comment naming a file (`# conftest.py`) is that file,
  written into the page's folder before its shell blocks run (the reader saves it there);
- the page runs in an empty folder, its shell blocks first, in order, as one bash script, then
  its other `python` blocks in one process and one namespace, in order (a later block uses
  what an earlier one defined), top-level `await` on one event loop, with the names a reader's
  own app brings defined first (`Order`, `definitions`, `stop_event` already set, `app`,
  `require_staff`, `store` on `MONGODB_URL`);
- `MONGODB_URL`: a page that runs `harel-beanie server` exports what it printed, as the page
  says. Any other page gets a server of its own (`harel-beanie server` in a folder beside the
  page's): the reader's, set up as getting-started says, and exported in its shell, except on a
  page that runs `harel-beanie demo`, which starts from a fresh terminal (its commands start
  the embedded server in the folder, as printed); there `$MONGODB_URL` still names the
  reader's server in a block that writes it, and the Python blocks get it;
- a `pip install` line is skipped: the package under test is installed already (its
  commands on PATH, beside this interpreter); pytest, where a page runs it, loads only the
  plugins that the package with its `testing` extra installs (`extra_plugins`), as in the
  reader's fresh virtual environment, not every plugin this suite's environment holds;
- `harel-beanie demo` gets `-n 24` (a small run: every kind of ending, in seconds);
- fixed ports are moved to free ones, so two runs of the suite on one machine do not collide:
  `harel-beanie server` (27018 in the text, and in the `export MONGODB_URL=` line that
  repeats what it printed), `harel-beanie dashboard` (8000, or its `--port`);
- a command that serves until stopped (`server`, `dashboard`, `worker`) runs in the
  background until its ready line is printed, and is stopped at the end of its block,
  `server` at the end of the page (it is "in a terminal of its own"), by SIGTERM, which each
  of them handles as Ctrl-C (a background job of a script ignores SIGINT).
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from harel_beanie.deploy.embedded import free_port

#: languages whose blocks are code to run
SHELLS = {"sh", "bash", "shell", "console"}
RUNNABLE = SHELLS | {"python"}


def _yaml(text: str) -> object:
    import yaml

    return yaml.safe_load(text)


#: languages whose blocks are data, and the parser each must pass
PARSED: dict[str, Callable[[str], object]] = {"toml": tomllib.loads, "json": json.loads, "yaml": _yaml}

FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[ \t]*$")
MARKER = re.compile(r"^[ \t]*<!--[ \t]*fragment:(?P<reason>.*?)-->[ \t]*$")
#: a python block that is a file the reader saves: its first line names it
FILE = re.compile(r"^#[ \t]*(?P<name>[\w./-]+\.py)[ \t]*$")
#: commands that serve until stopped, and the line each prints once it serves
SERVING = {"server": "export MONGODB_URL=", "dashboard": "open http://", "worker": " ready: "}


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts (1-based line of its fence), its language, its text
    (dedented by its fence's indent) and its fragment marker's reason (None: no marker)."""

    line: int
    lang: str
    body: str
    fragment: str | None

    @property
    def file(self) -> str | None:
        """The file a python block is, if its first line names one."""
        first = self.body.split("\n", 1)[0]
        found = FILE.match(first) if self.lang == "python" else None
        return found.group("name") if found else None


def page_blocks(text: str) -> list[Block]:
    """Every fenced block of a page, in order; an unclosed fence raises ValueError."""
    lines = text.split("\n")
    out: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent = opening.group("indent")
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"line {i + 1}: a fence that is never closed")
        body = "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end])
        above = lines[i - 1] if i > 0 else ""
        marker = MARKER.match(above)
        reason = marker.group("reason").strip() if marker else None
        if reason is None and "<!--" in above and "fragment" in above:
            reason = ""  # a marker misspelt: refused below, not run as if unmarked
        out.append(Block(i + 1, opening.group("lang"), body + "\n", reason))
        i = end + 1
    return out


def problems(blocks: list[Block]) -> list[str]:
    """What is wrong with a page's blocks whatever runs: a fence naming no language, a marker
    with no reason, a data block that does not parse."""
    out = []
    for b in blocks:
        if not b.lang:
            out.append(f"line {b.line}: a fence names no language (```python, ```sh, ```text ...)")
        if b.fragment == "":
            out.append(f"line {b.line}: a fragment marker without its reason (<!-- fragment: the reason -->)")
        if b.fragment is None and b.lang in PARSED:
            try:
                PARSED[b.lang](b.body)
            except Exception as exc:  # any parser's error: the block is not what it says
                out.append(f"line {b.line}: this {b.lang} block does not parse: {exc}")
    return out


def shell_lines(block: Block) -> list[str]:
    """The commands of a shell block (of a `console` block, its `$ ` lines without the prompt)."""
    raw = block.body.splitlines()
    if block.lang == "console":
        raw = [line[2:] for line in raw if line.startswith("$ ")]
    return raw


def runs_server(blocks: list[Block]) -> bool:
    return any(
        line.split()[:2] == ["harel-beanie", "server"]
        for b in blocks
        if b.lang in SHELLS and b.fragment is None
        for line in shell_lines(b)
    )


def runs_demo(blocks: list[Block]) -> bool:
    return any(
        line.split()[:2] == ["harel-beanie", "demo"]
        for b in blocks
        if b.lang in SHELLS and b.fragment is None
        for line in shell_lines(b)
    )


def installed_with(pyproject: Path, extra: str) -> set[str]:
    """The distributions `pip install 'harel-beanie[extra]'` installs: the package's own
    requirements and the extra's (from pyproject.toml, not the installed metadata, which lags
    until the next install), and all they require, as installed here."""
    project = tomllib.loads(pyproject.read_text())["project"]
    todo = [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"][extra]]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here: it brings no plugin to this run
        for wanted in requires:
            sub = Requirement(wanted)
            # a requirement of one of its own extras is installed only with that extra
            extras = req.extras or {""}
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                todo.append(sub)
    return seen


def extra_plugins(pyproject: Path, extra: str = "testing") -> list[str]:
    """The pytest plugins (entry points) of what the package with `extra` installs."""
    dists = installed_with(pyproject, extra)
    return sorted(
        {
            ep.value
            for ep in importlib.metadata.entry_points(group="pytest11")
            if ep.dist is not None and canonicalize_name(ep.dist.name) in dists
        }
    )


PRELUDE = [
    "set -euo pipefail",
    'BG="$(mktemp -d)"; touch "$BG/block" "$BG/page"; EARLY=""',
    # stop serving commands as Ctrl-C does, and wait for them (their servers stop with them;
    # 60 s at most each, then SIGKILL). One that stopped on its own before (a port taken after
    # its ready line, say) fails the page, its output shown.
    'stop() { for pid in $(cat "$BG/$1"); do if kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid" 2>/dev/null || true;'
    '  else rc=0; wait "$pid" 2>/dev/null || rc=$?; if [ "$rc" != 0 ] && [ "$rc" != 127 ]; then EARLY=1;'
    '  echo "a serving command stopped on its own before the end of its block, exit $rc:" >&2; cat "$BG/$pid.log" >&2;'
    "  fi; fi; done;"
    '  for pid in $(cat "$BG/$1"); do for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1;'
    '  done; kill -KILL "$pid" 2>/dev/null || true; done; : > "$BG/$1"; }',
    """trap 'stop block; stop page; [ -z "$EARLY" ] || exit 1' EXIT""",
    # run a serving command in the background until it prints its ready line (60 s at most)
    '_bg() { local life=$1 ready=$2; shift 2; local log="$BG/$RANDOM.$RANDOM.log"; "$@" > "$log" 2>&1 &'
    '  local pid=$!; echo "$pid" >> "$BG/$life"; ln -s "$log" "$BG/$pid.log";'
    '  for _ in $(seq 600); do if grep -q -- "$ready" "$log"; then cat "$log"; return 0; fi;'
    '    if ! kill -0 "$pid" 2>/dev/null; then cat "$log"; echo "exited before: $ready" >&2; return 1; fi;'
    '    sleep 0.1; done; cat "$log"; return 1; }',
]


def changed(line: str, ports: dict[str, int]) -> str | None:
    """A shell line as the script runs it (None: skipped), changed only as the module says."""
    if line.startswith("pip install"):
        return None
    line = line.replace("127.0.0.1:27018", f"127.0.0.1:{ports['server']}")
    words = line.split()
    if words[:2] == ["harel-beanie", "demo"]:
        line += " -n 24"
    if words[:1] == ["harel-beanie"] and len(words) > 1 and words[1] in SERVING:
        command = words[1]
        if command == "server":
            line += f" --port {ports['server']}"
        if command == "dashboard":
            ports["dashboard"] = free_port()  # each its own: two dashboards of one block both serve
            if "--port" in words:
                line = re.sub(r"--port \d+", f"--port {ports['dashboard']}", line)
            else:
                line += f" --port {ports['dashboard']}"
        life = "page" if command == "server" else "block"
        line = f"_bg {life} {json.dumps(SERVING[command])} {line}"
    return line


def shell_script(blocks: list[Block], ports: dict[str, int], folder: Path, reader_server: bool) -> str:
    """The page's shell blocks as one bash script, changed only as the module says; with
    `reader_server`, the reader's own server is started first in `folder`."""
    out = list(PRELUDE)
    if reader_server:
        out += [
            f'(cd "{folder}" && _bg page {json.dumps(SERVING["server"])} harel-beanie server --port {ports["reader"]})'
            " > /dev/null",
            f"MONGODB_URL=mongodb://127.0.0.1:{ports['reader']}",
        ]
        if not runs_demo(blocks):
            out.append("export MONGODB_URL")
    for block in blocks:
        if block.lang not in SHELLS or block.fragment is not None:
            continue
        for raw in shell_lines(block):
            line = raw.split("  #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
            run = changed(line, ports) if line else None
            if run is None:
                continue
            out.append(f"echo {shlex.quote('$ ' + raw.strip())}")
            out.append(run)
        out.append("stop block")
    return "\n".join(out) + "\n"


#: the Python blocks' runner: the names a reader's own app brings, then each block in order
PYTHON_RUNNER = """
import asyncio, json, os, sys
from beanie import Document
from fastapi import FastAPI
from pymongo import AsyncMongoClient
from harel_beanie import AsyncMongoStore
from harel_beanie.dashboard import no_auth
from harel_beanie.deploy import default_models_dir, load_models

class Order(Document):  # a reader's own Beanie document
    sku: str = ""

definitions = load_models(default_models_dir())  # the reader's machines: the shop's
stop_event = asyncio.Event()
stop_event.set()  # a worker started by a snippet claims, finds it set, and stops
app = FastAPI()
require_staff = no_auth
store = AsyncMongoStore(AsyncMongoClient(os.environ["MONGODB_URL"]), "harel")  # the reader's store
loop = asyncio.new_event_loop()
asyncio.set_event_loop(loop)
namespace = dict(globals())
for line, source in json.load(open(sys.argv[1])):
    code = compile(source, f"the block at line {line}", "exec", flags=__import__("ast").PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, namespace)
    if asyncio.iscoroutine(result):
        loop.run_until_complete(result)
    print(f"python block at line {line}: ran")
"""
