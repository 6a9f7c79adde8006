"""The command line imports only what a command uses.

Every command once spent about 1.3 s of CPU importing harel, Beanie, PyMongo, FastAPI and rich
before doing anything, `--version` included, because the entry module imported every
command's whole stack and the package's face imported the store. This checks the structure,
not a time: after `--version`, `--help` (the top one and each command's) and a flag refused,
none of the heavy libraries is in `sys.modules` of the process that answered.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.commands.test_cli import cli_env

#: what a command that only answers about its flags must not load
HEAVY = (
    "harel",
    "beanie",
    "pymongo",
    "motor",
    "bson",
    "fastapi",
    "starlette",
    "uvicorn",
    "pydantic",
    "rich",
    "textual",
)

#: runs the command line in-process, then prints the heavy modules it loaded, whatever it exits with
_PROBE = """
import json, sys
from harel_beanie.commands.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(%r)))
print("HEAVY=" + json.dumps(heavy), file=sys.stderr)
"""

COMMANDS = ["demo", "server", "worker", "status", "monitor", "dashboard", "prune", "migrate", "migrate-transport"]
COMMANDS += ["shard", "check-history"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--version"],
        ["--help"],
        *[[c, "--help"] for c in COMMANDS],
        ["prune", "--finished-before", "30"],  # refused by the command's own check
        ["prune", "--finished-before", "30d", "--batch-size", "0"],  # refused by argparse
        ["status", "--stuck-after", "-1"],
        ["demo", "--model", "models"],  # an abbreviation, refused
        ["worker", "--concurrency", "lots"],
        ["nonsense"],
    ],
    ids=lambda argv: " ".join(argv),
)
def test_answering_about_flags_loads_no_heavy_library(tmp_path: Path, argv: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE % json.dumps(HEAVY), *argv],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    marker = [line for line in proc.stderr.splitlines() if line.startswith("HEAVY=")]
    assert marker, proc.stderr
    assert json.loads(marker[-1].removeprefix("HEAVY=")) == [], f"{' '.join(argv)} imported {marker[-1]}"
