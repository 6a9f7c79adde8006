"""The scale benchmark's report: its section of bench/RESULTS.md (time against size for every
operation, harel's MongoStore beside this package's store, prune's and the migration's
rates, the server's memory) and the chart of time against size (log-log) in docs/."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from bench.scale.store import STORE_LABEL, STORE_OPS
from bench.scale.upkeep import EDGE, Rates


@dataclass
class Figures:
    """One server's run: per operation, per size, the median ms."""

    name: str
    info: dict[str, str]
    sizes: list[int] = field(default_factory=list)
    ms: dict[str, dict[int, float]] = field(default_factory=dict)  # operation -> size -> ms
    harel: dict[str, dict[int, float]] = field(default_factory=dict)  # harel's store, where it has the op
    seeding: dict[int, float] = field(default_factory=dict)  # seconds to reach each size (this layout)
    counts: dict[int, dict[str, int]] = field(default_factory=dict)  # size -> status -> documents
    rss: dict[int, tuple[float, float]] = field(default_factory=dict)  # size -> (MB resident, MB peak)
    prune: dict[int, Rates] = field(default_factory=dict)
    migrate: dict[int, tuple[int, Rates, float]] = field(default_factory=dict)  # size -> (executions, rates, s)
    load: list[tuple[float, float, float]] = field(default_factory=list)
    reads: dict[str, dict[int, int]] = field(default_factory=dict)  # view -> size -> documents read

    def put(self, op: str, n: int, ms: float, harel: Optional[float] = None) -> None:
        self.ms.setdefault(op, {})[n] = ms
        if harel is not None:
            self.harel.setdefault(op, {})[n] = harel


def _ms(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if math.isnan(x):
        return "timed out"
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}" if x >= 10 else f"{x:,.2f}"


def _x(a: Optional[float], b: Optional[float]) -> str:
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b <= 0:
        return "-"
    return f"{a / b:.2f}x"


def _rate(r: Optional[float]) -> str:
    return "-" if r is None else f"{r:,.0f}/s"


def time_table(figs: Figures) -> list[str]:
    sizes = figs.sizes
    head = " | ".join(f"{n:,}" for n in sizes)
    out = [f"| operation (ms) | {head} | largest / smallest |", "|---|" + "---:|" * (len(sizes) + 1)]
    for op, per in figs.ms.items():
        cells = " | ".join(_ms(per.get(n)) for n in sizes)
        out.append(f"| {STORE_LABEL.get(op, op)} | {cells} | {_x(per.get(sizes[-1]), per.get(sizes[0]))} |")
    return out


def harel_table(figs: Figures) -> list[str]:
    sizes = figs.sizes
    cols = " | ".join(f"{n:,}: harel-beanie | {n:,}: harel | harel-beanie / harel" for n in sizes)
    out = [f"| operation (ms) | {cols} |", "|---|" + "---:|" * (3 * len(sizes))]
    for op in STORE_OPS:
        if op not in figs.harel:
            continue
        cells = []
        for n in sizes:
            ours, theirs = figs.ms.get(op, {}).get(n), figs.harel[op].get(n)
            cells += [_ms(ours), _ms(theirs), _x(ours, theirs)]
        out.append(f"| {STORE_LABEL[op]} | " + " | ".join(cells) + " |")
    return out


def upkeep_table(figs: Figures) -> list[str]:
    out = [
        "| executions | seeding (s) | mix: DONE / RUNNING / FAILED (documents) | server memory: resident / peak (MB) "
        "| prune: removed in (s) | prune: its first third | prune: its last third | migrate up: executions "
        f"| migrate up: whole run (s) | migrate up: first {EDGE} batches | migrate up: last {EDGE} batches |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in figs.sizes:
        c = figs.counts.get(n, {})
        mix = f"{c.get('DONE', 0):,} / {c.get('RUNNING', 0):,} / {c.get('FAILED', 0):,}"
        rss = figs.rss.get(n)
        mem = "-" if rss is None else f"{rss[0]:,.0f} / {rss[1]:,.0f}"
        p = figs.prune.get(n)
        pruned = "-" if p is None else f"{p.done:,} in {p.seconds:,.1f}"
        m = figs.migrate.get(n)
        moved = (
            ("-", "-", "-", "-")
            if m is None
            else (f"{m[0]:,}", f"{m[2]:,.1f}", _rate(m[1].rate(True)), _rate(m[1].rate(False)))
        )
        out.append(
            f"| {n:,} | {figs.seeding.get(n, 0.0):,.0f} | {mix} | {mem} | {pruned} "
            f"| {_rate(p.third_rate(True) if p else None)} | {_rate(p.third_rate(False) if p else None)} | "
            + " | ".join(moved)
            + " |"
        )
    return out


def reads_table(figs: Figures) -> list[str]:
    """The documents each operator view reads (its reads' filters' matches), by size."""
    sizes = figs.sizes
    head = " | ".join(f"{n:,}" for n in sizes)
    out = [f"| view (documents read) | {head} |", "|---|" + "---:|" * len(sizes)]
    for view, per in figs.reads.items():
        out.append(f"| {view} | " + " | ".join("-" if per.get(n) is None else f"{per[n]:,}" for n in sizes) + " |")
    return out


def section(runs: list[Figures], header: list[str], chart: Optional[str]) -> str:
    out = ["## Scale: time against the number of stored executions", "", *header]
    for figs in runs:
        info = figs.info
        out += ["", f"### {info['server']}", ""]
        loads = ["/".join(f"{x:.2f}" for x in la) for la in figs.load]
        load = " at the start, ".join(loads) + (" at the end" if len(loads) > 1 else " at the start")
        out.append(f"Reports itself as {info['reports']}, {info['topology']}. Load average (1/5/15 min) {load}.")
        out += ["", "#### Time per operation (median ms) against executions stored", ""] + time_table(figs)
        if figs.harel:
            out += ["", "#### The store's operations beside harel's MongoStore (same executions, its layout)", ""]
            out += harel_table(figs)
        out += ["", "#### Seeding, memory, prune, migrate", ""] + upkeep_table(figs)
        if figs.reads:
            out += ["", "#### What the operator's views read (documents their reads match, after two reads)", ""]
            out += reads_table(figs)
    if chart:
        # named, not embedded: the manual includes this file from another folder, where a
        # relative image link would not resolve; the manual's pages show the chart
        out += ["", f"The chart of these figures (time against size, log-log): `{chart}`."]
    return "\n".join(out) + "\n"


def draw(runs: list[Figures], path: Path) -> None:
    """Time against size, log-log: one line per operation; the operator's side and the store's
    side in two panels, harel's MongoStore dashed beside the store."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 2, figsize=(16, 7 * len(runs)), squeeze=False)
    for row, figs in zip(axes, runs):
        for ax, side in zip(row, ("operator", "store")):
            ops = [op for op in figs.ms if (op in STORE_LABEL) == (side == "store")]
            for k, op in enumerate(ops):
                look = {"color": plt.get_cmap("tab20")(k % 20), "marker": "osD^v<>"[k % 7]}
                _line(ax, figs.ms[op], STORE_LABEL.get(op, op), "-", look)
                if op in figs.harel:  # the same colour, dashed
                    _line(ax, figs.harel[op], f"harel MongoStore: {op}", "--", look)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("executions stored")
            ax.set_ylabel("median ms")
            ax.set_title(
                f"{figs.info['server']}: {'dashboard, status, queries' if side == 'operator' else 'store and transport'}",
                fontsize=9,
            )
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _line(ax: Any, per: dict[int, float], label: str, style: str, look: dict[str, Any]) -> None:
    xs = [n for n in sorted(per) if not math.isnan(per[n]) and per[n] > 0]
    if xs:
        ax.plot(xs, [per[n] for n in xs], style, label=label, **look)
