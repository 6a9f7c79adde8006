"""How the history checker words what it found: counts, ranges of numbers, a value cut
short, the differences between two states, a few ids of many.

Why this module exists: the checker's rules (`harel_beanie.history.checker`) should read as
rules; the phrasing of their anomalies is a job of its own.
"""

from __future__ import annotations

from typing import Any, Mapping


def times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def ranges(numbers: list[int]) -> str:
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def diff(got: Mapping[str, Any], want: Mapping[str, Any], keys: tuple[str, ...]) -> list[str]:
    out = []
    for key in keys:
        a, b = got.get(key), want.get(key)
        if a == b:
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for k in sorted(set(a) | set(b), key=str):
                if a.get(k) != b.get(k):
                    out.append(f"{key}.{k}: history {short(a.get(k))}, replay {short(b.get(k))}")
        else:
            out.append(f"{key}: history {short(a)}, replay {short(b)}")
    return out


def short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def listed(ids: list[str], shown: int = 3) -> str:
    named = ", ".join(repr(eid) for eid in ids[:shown])
    return named + (f" and {len(ids) - shown} more" if len(ids) > shown else "")
