"""Regenerate docs/RELIABILITY.md from a run of the reliability tests.

    python docs/reliability.py              # run the default reliability tests, then render
    python docs/reliability.py --soak       # run the soak (`-m soak`) instead, then render
    python docs/reliability.py --render     # render from the recorded runs only, run nothing
    python docs/reliability.py --rerun -- -k EXPR   # soak tests a fix changed, kept beside the soak

A run records the figures of the commit it names, and nothing else: it refuses to start
while `src/`, `tests/` or this script have uncommitted changes (commit first, then run, then
commit the page and the recorded run; `--allow-uncommitted` runs anyway, and the page then
says so). The page is never edited by hand: `tests/package/test_reliability_page.py` fails
while docs/RELIABILITY.md differs from the render of the recorded runs, so prose goes into
the template and a test's docstring, then `--render`. A recorded run that predates a test
(or names one that moved or went) shows it under "Figures", so a page whose figures
are older than the tests says so.

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
  figures, one row naming the test's node id and its figures; then the tests of the current
  files that the runs did not record, and the recorded node ids that name no current test.

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
#: what a run's figures depend on: a change here not yet committed is not the commit it names
SOURCES = ("src", "tests", "docs/reliability.py")


def test_files() -> list[Path]:
    return sorted(TESTS.glob("test_reliability_*.py"))


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# --- running -------------------------------------------------------------------------------


def uncommitted() -> list[str]:
    """The files under `SOURCES` that differ from the commit (git's short status lines)."""
    return [line for line in git("status", "--porcelain", "--", *SOURCES).splitlines() if line.strip()]


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
            "uncommitted_changes": bool(uncommitted()),
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


def current_tests() -> dict[str, dict[str, Any]]:
    """`file::function` -> the function's entry (`functions`), for every current test."""
    return {f"{rel(path)}::{f['name']}": f for path in test_files() for f in functions(path)}


def _by_file(names: list[str], tests: dict[str, dict[str, Any]]) -> str:
    """Node ids (`file::function`) grouped by file: a file all of whose functions are named
    as "all n", else the functions' names."""
    files: dict[str, list[str]] = defaultdict(list)
    for name in names:
        path, _, function = name.partition("::")
        files[path].append(function)
    out = []
    for path, named in files.items():
        whole = sum(1 for t in tests if t.startswith(path + "::"))
        said = f"all {whole}" if whole and len(named) == whole else ", ".join(f"`{n}`" for n in named)
        out.append(f"`{path}` ({said})")
    return "; ".join(out)


def staleness(runs: dict[str, dict[str, Any]]) -> str:
    """What the recorded runs do not cover: a test function of the current files with no
    case in the run that should hold it (the default run for a plain test, the soak for a
    soak test), and recorded node ids that name no current test function (moved or gone)."""
    tests = current_tests()
    lines = []
    for kind, soak in (("default", False), ("soak", True)):
        run = runs.get(kind)
        ran = {nid.split("[", 1)[0] for nid in run["tests"]} if run else set()
        wanted = {name: f for name, f in tests.items() if f["soak"] == soak}
        missing = [name for name in wanted if name not in ran]
        if missing:
            lines.append(
                f"- {len(missing)} of the {len(wanted)} {'soak' if soak else 'default'} test functions are not in the "
                f"recorded {kind} run: {_by_file(missing, wanted)}"
            )
    for kind in RUNS:
        recorded = {nid.split("[", 1)[0] for nid in (runs.get(kind) or {}).get("tests", {})}
        gone = sorted(recorded - set(tests))
        if gone:
            lines.append(
                f"- {len(gone)} test functions of the recorded {kind} run are under ids no current test has (moved "
                f"or removed since): {_by_file(gone, {g: {} for g in gone})}"
            )
    if not lines:
        return "Every current test is in the recorded runs, under its current id."
    return (
        "The recorded runs are older than the tests: `make reliability` (and `make reliability-soak`) "
        "record them again.\n\n" + "\n".join(lines)
    )


def load_runs() -> dict[str, dict[str, Any]]:
    """The recorded runs, by kind."""
    return {
        k: json.loads((HERE / f"{k}.json").read_text(encoding="utf-8")) for k in RUNS if (HERE / f"{k}.json").exists()
    }


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
            out += ["", "### What the recorded runs do not cover", "", staleness(runs)]
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
    parser.add_argument(
        "--allow-uncommitted",
        action="store_true",
        help="run although src/, tests/ or this script have uncommitted changes (the page says so)",
    )
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    status = 0
    HERE.mkdir(exist_ok=True)
    if not args.render:
        changed = uncommitted()
        if changed and not args.allow_uncommitted:
            print(
                "refused: the figures are recorded for the commit they name, and these files differ from it:\n  "
                + "\n  ".join(changed)
                + "\ncommit them first (or pass --allow-uncommitted; the page then says so)",
                file=sys.stderr,
            )
            return 2
        kind = "rerun" if args.rerun else "soak" if args.soak else "default"
        status, run = run_tests(kind, args.pytest_args)
        (HERE / f"{kind}.json").write_text(json.dumps(run, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    OUTPUT.write_text(render(load_runs()), encoding="utf-8")
    print(f"wrote {rel(OUTPUT)}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
