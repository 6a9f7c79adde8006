"""Sections of bench/RESULTS.md that a benchmark other than bench/store/run.py writes: each between
its own markers, replaced whole by the next run of its benchmark, and kept as they are when
bench/store/run.py rewrites the rest of the file."""

from __future__ import annotations

import re
from pathlib import Path

_BEGIN = "<!-- section {name}: begin -->"
_END = "<!-- section {name}: end -->"
_ANY = re.compile(r"<!-- section (\S+): begin -->.*?<!-- section \1: end -->\n?", re.S)


def block(name: str, body: str) -> str:
    """`body` between the markers of section `name`."""
    return f"{_BEGIN.format(name=name)}\n{body.rstrip()}\n{_END.format(name=name)}\n"


def splice(path: Path, name: str, body: str) -> None:
    """Write section `name` into the file at `path`: in place of the previous one, else at the
    end (a missing file is started with the results' title)."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    begin, end = _BEGIN.format(name=name), _END.format(name=name)
    new = block(name, body)
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1].removeprefix("\n")
        text = head + new + tail
    else:
        text = text.rstrip("\n") + "\n\n" + new
    path.write_text(text)


def kept(path: Path) -> str:
    """Every marked section of the file at `path` (empty if none): what a rewrite keeps."""
    if not path.exists():
        return ""
    found = [m.group(0) for m in _ANY.finditer(path.read_text())]
    return "".join("\n" + (f if f.endswith("\n") else f + "\n") for f in found)
