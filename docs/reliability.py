"""Regenerate docs/RELIABILITY.md from a run of the reliability tests.

    python docs/reliability.py              # run the default reliability tests, then render
    python docs/reliability.py --soak       # run the soak (`-m soak`) instead, then render
    python docs/reliability.py --render     # render from the recorded runs only, run nothing
    python docs/reliability.py --rerun -- -k EXPR   # soak tests a fix changed, kept beside the soak

The tests are every `tests/reliability/test_reliability_*.py`. They run with `HAREL_BEANIE_FIGURES`
naming a scratch file, so each test's `figures` fixture (tests/support/figures.py) and outcome are
recorded under its node id, with one line describing the run (server, versions, machine).
The run is kept in `docs/reliability/<default|soak>.json` (so the document can be rendered
again, and the two runs are rendered together whichever ran last), and the document is
`docs/reliability/template.md` with these lines replaced:

- `@tests <file>`: the table of that file's tests, one row per test function, its "proves"
  text taken from the function's docstring (never written twice), and how many of its
  cases passed in the default run;
- `@findings`: the tests the last runs reported as expected failures, with their reasons;
- `@runs`: for each recorded run, where and when it ran and, for every test that recorded
  figures, one row naming the test's node id and its figures.

A reliability test file with no `@tests` line in the template gets a section of its own
at the end of "What each file proves", titled from its module docstring, so a new file
shows up without touching this script. Exit status: the test run's.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests" / "reliability"
HERE = ROOT / "docs" / "reliability"
TEMPLATE = HERE / "template.md"
OUTPUT = ROOT / "docs" / "RELIABILITY.md"
RUNS = ("default", "soak", "rerun")
#: each run's title in the document
TITLES = {"default": "Default run", "soak": "Soak run", "rerun": "Soak re-run of the scenarios a fix changed"}
ENV = "HAREL_BEANIE_FIGURES"  # as tests/support/figures.py


def test_files() -> list[Path]:
    return sorted(TESTS.glob("test_reliability_*.py"))


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# --- running -------------------------------------------------------------------------------


def run_tests(kind: str, extra: list[str]) -> tuple[int, dict[str, Any]]:
    """Run the reliability tests (`kind` "default" or "soak") recording their figures, and
    return pytest's exit status and the run as kept in docs/reliability/<kind>.json."""
    with tempfile.TemporaryDirectory() as scratch:
        lines = Path(scratch) / "figures.jsonl"
        env = {**os.environ, ENV: str(lines)}
        marker = ["-m", "soak"] if kind in ("soak", "rerun") else []
        argv = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *marker,
            *extra,
            *(rel(f) for f in test_files()),
        ]
        print("running:", " ".join(["python", *argv[1:]]), flush=True)
        at = {
            "commit": git("rev-parse", "--short=12", "HEAD"),
            "uncommitted_changes": bool(git("status", "--porcelain", "--", "src", "tests")),
        }
        started = time.monotonic()
        status = subprocess.call(argv, cwd=ROOT, env=env)
        seconds = time.monotonic() - started
        records = (
            [json.loads(line) for line in lines.read_text(encoding="utf-8").splitlines()] if lines.exists() else []
        )
    command = shlex.join(["pytest", *marker, *extra]) + " tests/reliability/test_reliability_*.py"
    return status, collect(records, kind, command, seconds, status, at)


def collect(
    records: list[dict[str, Any]], kind: str, command: str, seconds: float, status: int, at: dict[str, Any]
) -> dict[str, Any]:
    """The run as kept: `at` is the commit the tests ran at (taken before they started)."""
    session: dict[str, Any] = {}
    tests: dict[str, dict[str, Any]] = defaultdict(dict)
    for r in records:
        if r["kind"] == "session":
            session = r
        elif r["kind"] == "test":
            tests[r["test"]]["figures"] = r["figures"]
        elif r["kind"] == "outcome":
            entry = tests[r["test"]]
            if entry.get("outcome", "passed") == "passed":  # a failed teardown overrides a passed call
                entry.update(outcome=r["outcome"], seconds=r["seconds"])
                if r.get("reason"):
                    entry["reason"] = r["reason"]
    totals = Counter(t.get("outcome", "unknown") for t in tests.values())
    return {
        "run": kind,
        "command": command,
        **at,
        "pytest_status": status,
        "seconds": round(seconds, 1),
        "totals": dict(sorted(totals.items())),
        "session": {k: v for k, v in session.items() if k != "kind"},
        "tests": {k: tests[k] for k in sorted(tests)},
    }


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


# --- what the tests say about themselves -----------------------------------------------------


def functions(path: Path) -> list[dict[str, Any]]:
    """The test functions of a file, in file order: name, docstring, soak / xfail marks."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            marks = {ast.unparse(d).split("(")[0].removeprefix("pytest.mark.") for d in node.decorator_list}
            out.append(
                {
                    "name": node.name,
                    "doc": ast.get_docstring(node) or "",
                    "soak": "soak" in marks,
                    "xfail": "xfail" in marks,
                }
            )
    return out


def one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def module_title(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or path.stem
    return doc.split("\n\n")[0]


def function_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[1].split("[", 1)[0]


def cases(run: Optional[dict[str, Any]], path: Path, name: str) -> str:
    if run is None:
        return ""
    prefix = rel(path) + "::"
    got = Counter(
        t.get("outcome", "?") for nid, t in run["tests"].items() if nid.startswith(prefix) and function_of(nid) == name
    )
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(got.items()))


def tests_table(path: Path, runs: dict[str, dict[str, Any]]) -> str:
    rows = ["| test | cases run | proves |", "|---|---|---|"]
    for f in functions(path):
        ran = "; ".join(f"{k}: {c}" for k in RUNS if (c := cases(runs.get(k), path, f["name"])))
        tags = " (soak)" if f["soak"] else ""
        proves = one_line(f["doc"]) or "*(no docstring: say what it proves in one)*"
        rows.append(f"| `{f['name']}`{tags} | {ran or 'not run'} | {proves} |")
    return "\n".join(rows)


# --- the runs ---------------------------------------------------------------------------------


def value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {value(x)}" for k, x in v.items()) + "}"
    return str(v)


def describe(run: dict[str, Any]) -> str:
    s = run.get("session") or {}
    server = s.get("server") or {}
    pkgs = s.get("packages") or {}
    machine = s.get("machine") or {}
    totals = ", ".join(f"{n} {k}" for k, n in run["totals"].items())
    changes = " (with uncommitted changes to src/ or tests/)" if run.get("uncommitted_changes") else ""
    return "\n".join(
        [
            f"- command: `{run['command']}`, {run['seconds']:.0f} s, pytest exit status {run['pytest_status']}: {totals}",
            f"- date: {s.get('date', '?')}, at commit `{run.get('commit') or '?'}`{changes}",
            f"- server: {server.get('name', '?')} {server.get('version', '?')} ({server.get('topology', '?')})",
            "- versions: " + ", ".join(f"{k} {v}" for k, v in pkgs.items()) + f", Python {s.get('python', '?')}",
            f"- machine: {machine.get('system', '?')} {machine.get('arch', '')}, {machine.get('cpus', '?')} CPUs",
        ]
    )


def figures_table(run: dict[str, Any]) -> str:
    rows = ["| test (node id) | outcome | s | figures |", "|---|---|---|---|"]
    for nid, t in run["tests"].items():
        outcome = t.get("outcome", "?")
        if not t.get("figures") and outcome == "passed":
            continue  # its cases are counted in the file's table
        figs = ", ".join(f"{k} {value(v)}" for k, v in t.get("figures", {}).items())
        if t.get("reason"):
            figs = (figs + "; " if figs else "") + one_line(t["reason"])
        rows.append(f"| `{one_line(nid)}` | {outcome} | {t.get('seconds', 0):.1f} | {one_line(figs)} |")
    return "\n".join(rows)


def runs_section(runs: dict[str, dict[str, Any]]) -> str:
    out = []
    for kind in RUNS:
        title = TITLES[kind]
        run = runs.get(kind)
        if run is None and kind == "rerun":
            continue  # only after a soak found something a fix changed
        if run is None:
            out.append(
                f"### {title}\n\nNot recorded yet: `python docs/reliability.py{' --soak' if kind == 'soak' else ''}`."
            )
            continue
        out.append(
            f"### {title}\n\n{describe(run)}\n\nEvery test that recorded figures, and every test that "
            f"did not simply pass:\n\n{figures_table(run)}"
        )
    return "\n\n".join(out)


def findings(runs: dict[str, dict[str, Any]]) -> str:
    rows: dict[str, tuple[str, str]] = {}
    for run in runs.values():
        for nid, t in run["tests"].items():
            if t.get("outcome") in ("xfailed", "xpassed"):
                rows.setdefault(nid.split("[")[0], (t["outcome"], one_line(t.get("reason", ""))))
    if not rows:
        return "No test is marked as an expected failure: nothing open."
    lines = ["| test | last outcome | finding |", "|---|---|---|"]
    lines += [f"| `{nid}` | {o} | {r} |" for nid, (o, r) in sorted(rows.items())]
    return "\n".join(lines)


def render(runs: dict[str, dict[str, Any]]) -> str:
    lines = TEMPLATE.read_text(encoding="utf-8").splitlines()
    placed = {line.split(None, 1)[1].strip() for line in lines if line.startswith("@tests ")}
    out: list[str] = [
        "<!-- Generated by docs/reliability.py from docs/reliability/template.md, the tests'",
        "     docstrings and the recorded runs in docs/reliability/*.json. Do not edit by hand. -->",
        "",
    ]
    for line in lines:
        if line.startswith("@tests "):
            out.append(tests_table(ROOT / line.split(None, 1)[1].strip(), runs))
        elif line.strip() == "@other-tests":
            for path in test_files():
                if rel(path) not in placed:
                    out += [f"### {one_line(module_title(path))} — `{rel(path)}`", "", tests_table(path, runs), ""]
        elif line.strip() == "@findings":
            out.append(findings(runs))
        elif line.strip() == "@runs":
            out.append(runs_section(runs))
        else:
            out.append(line)
    return "\n".join(out).rstrip() + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--soak", action="store_true", help="run the soak (-m soak) instead of the default tests")
    parser.add_argument(
        "--rerun",
        action="store_true",
        help="run soak tests chosen by the pytest arguments (-k ...) after a fix, kept beside the soak",
    )
    parser.add_argument("--render", action="store_true", help="only render from the recorded runs")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    status = 0
    HERE.mkdir(exist_ok=True)
    if not args.render:
        kind = "rerun" if args.rerun else "soak" if args.soak else "default"
        status, run = run_tests(kind, args.pytest_args)
        (HERE / f"{kind}.json").write_text(json.dumps(run, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    runs = {
        k: json.loads((HERE / f"{k}.json").read_text(encoding="utf-8")) for k in RUNS if (HERE / f"{k}.json").exists()
    }
    OUTPUT.write_text(render(runs), encoding="utf-8")
    print(f"wrote {rel(OUTPUT)}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
