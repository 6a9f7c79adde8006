"""The markdown report (bench/RESULTS.md): per server, the tables of a run's figures, one
function per table, followed by the reading that explains the ratios (bench/store/reading.py), all
taken from the ServerRun the measurements filled, so nothing here talks to a server or times
anything."""

from __future__ import annotations

import datetime
import math
import statistics
from typing import Optional

from bench.common.harness import (
    BARE,
    BARE_RUNNERS,
    EQUAL,
    EQUAL_RUNNERS,
    EVENTS_PER_EXECUTION,
    INDEX_PURPOSE,
    OWN,
    OWN_INDEXES,
    RUNNER_LABEL,
    RUNNERS,
    STATES,
    TARGET,
    Options,
    ServerRun,
    machine,
    split_runner,
)
from bench.stack.report import stack_section
from bench.store.indexes import COMMIT_KINDS
from bench.store.reading import reading
from harel_beanie.core.documents import ExecutionDocument, index_models

# --- the report -------------------------------------------------------------------------------


def _f(x: Optional[float], digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def _x(ratio: Optional[float]) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _pct(a: Optional[float], b: Optional[float]) -> str:
    return "-" if a is None or b is None or b == 0 else f"{100 * a / b:.1f}%"


def report_server(run: ServerRun) -> str:
    """One server's section: its tables in the order they are read, then the reading of them."""
    lines = [f"## {run.info['server']}", ""]
    lines += _server(run)
    lines += _rates(run)
    lines += _every_measurement(run)
    lines += _round_trips(run)
    lines += _submits(run)
    lines += _equal_concern(run)
    lines += _targets(run)
    lines += _fewer_indexes(run)
    lines += _time_split(run)
    lines += stack_section(run)
    lines += ["", "### Reading these figures", ""]
    lines += reading(run)
    lines += _commit_costs(run)
    lines += _index_costs(run)
    return "\n".join(lines)


def _server(run: ServerRun) -> list[str]:
    """What the server reports itself as, the machine's load, and the bare update's ceiling."""
    return [
        f"Reports itself as {run.info['reports']}, {run.info['topology']}. Load average (1/5/15 min) "
        + " at the start, ".join("/".join(f"{x:.2f}" for x in la) for la in run.load)
        + " at the end of the measurements (the machine's other work shares its CPUs).",
        "",
        "Ceiling (bare `update_one` by `_id`, write concern w:1): "
        + ", ".join(f"{s:,.0f}" for s, _, _ in run.ceiling)
        + " updates/s one at a time (start, end of run); "
        + ", ".join(f"{p:,.0f}" for _, p, _ in run.ceiling)
        + " with 16 in flight. The same update one at a "
        f"time on a collection carrying this store's {len(index_models(ExecutionDocument))} indexes (it changes no "
        "indexed field): " + ", ".join(f"{x:,.0f}" for _, _, x in run.ceiling) + " updates/s.",
    ]


def _rates(run: ServerRun) -> list[str]:
    """Events/s per runner and database state, each store, their ratio and their share of the ceiling."""
    seq = statistics.mean(c[0] for c in run.ceiling)
    par = statistics.mean(c[1] for c in run.ceiling)
    lines = ["", "### Events/s through harel's engine", ""]
    lines.append(
        f"Median of {len(run.rates(RUNNERS[0], 'empty', 'beanie'))} interleaved round(s); *ratio* is the median of "
        "the rounds' own ratios (the two stores of a round run back to back). *stored*: the database "
        f"already holds {run.stored:,} finished executions. *ceiling*: the event rate as a share of the bare "
        "update rate (sequential ceiling for the DurableRunner and concurrency 1, 16-in-flight for concurrency 16)."
    )
    lines.append("")
    lines.append(
        "| runner | database | harel MongoStore | harel-beanie | ratio | harel-beanie stored / empty | ceiling: harel / harel-beanie |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|")
    for runner in RUNNERS:
        roof = par if split_runner(runner)[0] == "worker-16" else seq
        for state in STATES:
            h = run.rate(runner, state, "harel")
            b = run.rate(runner, state, "beanie")
            keep = _pct(b, run.rate(runner, "empty", "beanie")) if state == "stored" else ""
            lines.append(
                f"| {RUNNER_LABEL[runner]} | {state} | {_f(h)} | {_f(b)} | {_x(run.ratio(runner, state))} | {keep} | {_pct(h, roof)} / {_pct(b, roof)} |"
            )
    return lines


def _every_measurement(run: ServerRun) -> list[str]:
    """Every round's events/s and ratio, in run order."""
    lines = ["", "Every measurement, events/s (round by round, in run order):", ""]
    lines.append("| runner | database | harel MongoStore | harel-beanie | ratio |")
    lines.append("|---|---|---|---|---|")
    for runner in RUNNERS:
        for state in STATES:
            h_all = ", ".join(f"{x:,.1f}" for x in run.rates(runner, state, "harel"))
            b_all = ", ".join(f"{x:,.1f}" for x in run.rates(runner, state, "beanie"))
            ratios = ", ".join(f"{x:.2f}x" for x in run.paired(runner, state))
            lines.append(f"| {RUNNER_LABEL[runner]} | {state} | {h_all} | {b_all} | {ratios} |")
    return lines


def _round_trips(run: ServerRun) -> list[str]:
    """Round trips per event to each store, and for a worker to harel's transport."""
    lines = [
        "",
        "Round trips per event while timed, counted on the wire by a PyMongo CommandListener (median "
        "over rounds): to the store's collections, and for a worker also to harel's transport, which is "
        "the same for both stores.",
        "",
    ]
    lines.append(
        "| runner | database | store: harel MongoStore | store: harel-beanie | transport: harel / harel-beanie |"
    )
    lines.append("|---|---|---:|---:|---:|")
    for runner in RUNNERS:
        for state in STATES:
            hc, bc = run.calls(runner, state, "harel"), run.calls(runner, state, "beanie")
            tr = "" if split_runner(runner)[0] == "durable" else f"{_f(hc and hc[1], 2)} / {_f(bc and bc[1], 2)}"
            lines.append(f"| {RUNNER_LABEL[runner]} | {state} | {_f(hc and hc[0], 2)} | {_f(bc and bc[0], 2)} | {tr} |")
    return lines


def _submits(run: ServerRun) -> list[str]:
    """The rate of the create + send calls that queued a worker's work."""
    lines = ["", "Submitting the worker's work (create + send, one at a time, not in the figures above), calls/s:", ""]
    lines.append("| runner | database | harel MongoStore | harel-beanie | ratio |")
    lines.append("|---|---|---:|---:|---:|")
    for runner in RUNNERS:
        if split_runner(runner)[0] == "durable":
            continue
        for state in STATES:
            h, b = run.submit(runner, state, "harel"), run.submit(runner, state, "beanie")
            lines.append(f"| {RUNNER_LABEL[runner]} | {state} | {_f(h)} | {_f(b)} | {_ratio(b, h)} |")
    return lines


def _equal_concern(run: ServerRun) -> list[str]:
    """This store at its own write concern and at harel's, against harel's store."""
    if not any(c.store == EQUAL for c in run.cells):
        return []
    lines = ["", "### At equal write concern", ""]
    lines.append(
        "The same rounds, empty database: harel-beanie at its default (w: majority, j: true) and at harel's "
        "(the client default, w:1), against harel's store at its default. *ratio* as above, paired by round."
    )
    lines.append("")
    lines.append(
        "| runner | harel MongoStore (w:1) | harel-beanie (majority, j) | ratio | harel-beanie at w:1 | ratio |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|")
    for runner in EQUAL_RUNNERS:
        h, b, e = (run.rate(runner, "empty", k) for k in ("harel", "beanie", EQUAL))
        lines.append(
            f"| {RUNNER_LABEL[runner]} | {_f(h)} | {_f(b)} | {_x(run.ratio(runner, 'empty'))} | "
            f"{_f(e)} | {_x(run.ratio(runner, 'empty', EQUAL))} |"
        )
    return lines


def _targets(run: ServerRun) -> list[str]:
    """Each runner's ratio against the target it aims for."""
    lines = ["", "### Targets", ""]
    lines.append(
        f"What this store aims for: on an empty database, at least {TARGET[False]:.1f}x harel's rate untraced "
        f"and {TARGET[True]:.1f}x traced."
    )
    lines.append("")
    for runner in RUNNERS:
        x, xe = run.ratio(runner, "empty"), run.ratio(runner, "empty", EQUAL)
        b, bs = run.rate(runner, "empty", "beanie"), run.rate(runner, "stored", "beanie")
        goal = TARGET[split_runner(runner)[1]]
        ok1 = "met" if x and x >= goal else "NOT met"
        ok3 = "met" if xe and xe >= goal else "NOT met"
        lines.append(
            f"- {RUNNER_LABEL[runner]}: empty database {_x(x)} harel's at the stores' defaults (target {goal:.1f}x: "
            f"{ok1}), {_x(xe)} at equal write concern ({ok3}); with {run.stored:,} stored {_x(run.ratio(runner, 'stored'))} "
            f"harel's, {_pct(bs, b)} of its own empty-database rate."
        )
    return lines


def _fewer_indexes(run: ServerRun) -> list[str]:
    """This store with only `_id`, with only its own reads' indexes, and with every index."""
    if not any(c.store == BARE for c in run.cells):
        return []
    lines = ["", "### With fewer indexes", ""]
    lines.append(
        "The same store measured in the same rounds on an empty database, set up with fewer indexes "
        "(`create_schema=False`, then only the ones named): with only `_id`, none of its reads is "
        "index-backed; with only the two partial indexes its own operations read (the relay's pending "
        f"work, `{OWN_INDEXES[0]}`, and the timer sweep's, `{OWN_INDEXES[1]}`), its listing and dashboard "
        "reads are not. Neither is a configuration to run; together they show what each part of the index "
        "set costs this store on this server."
    )
    lines.append("")
    lines.append(
        "| runner | harel MongoStore | `_id` only | ratio | its own reads' indexes | ratio | every index | ratio |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for runner in BARE_RUNNERS:
        row = [RUNNER_LABEL[runner], _f(run.rate(runner, "empty", "harel"))]
        for kind in (BARE, OWN, "beanie"):
            row += [_f(run.rate(runner, "empty", kind)), _x(run.ratio(runner, "empty", kind))]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _time_split(run: ServerRun) -> list[str]:
    """Where a sequential runner's event time goes: each side's commands, the client, and CPU."""
    sequential = [r for r in RUNNERS if split_runner(r)[0] in ("durable", "worker-1")]
    if not any(run.split(r, "empty", "harel") for r in sequential):
        return []
    lines = ["", "### Where an event's time goes", ""]
    lines.append(
        "Empty database, runners whose commands go one at a time, ms per event (median over rounds of each "
        "part): the store's commands from sent to answered as the driver reports them (of which its "
        "updates, the commits), harel's transport's commands, and the rest, spent in the client process "
        "(harel's engine, the drivers, the worker's loop); then the CPU time the client process and the "
        "server spent per event (all their threads; the server's only when it runs on this machine). In "
        "brackets, the difference to harel's store."
    )
    lines.append("")
    lines.append(
        "| runner | store | event | store's commands | of which updates | transport's commands | client "
        "| CPU: client | CPU: server |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for runner in sequential:
        base = run.split(runner, "empty", "harel")
        for kind, label in (
            ("harel", "harel MongoStore"),
            (BARE, "harel-beanie, `_id` only"),
            ("beanie", "harel-beanie"),
        ):
            got = run.split(runner, "empty", kind)
            if got is None or base is None:
                continue
            cells = [
                "-"
                if math.isnan(got[k])
                else f"{got[k]:.2f}" + ("" if kind == "harel" else f" ({got[k] - base[k]:+.2f})")
                for k in ("wall", "store", "store update", "transport", "client", "client cpu", "server cpu")
            ]
            lines.append(f"| {RUNNER_LABEL[runner]} | {label} | " + " | ".join(cells) + " |")
    return lines


def _commit_costs(run: ServerRun) -> list[str]:
    """What each commit kind costs with every index, with only `_id`, and on harel's store."""
    if not run.index_costs:
        return []
    costs = run.index_costs
    lines = ["", "### What each commit kind costs, and each index", ""]
    lines.append(
        "harel-beanie's store committing directly (no engine; a dedupe window of 100, full), ms per "
        "operation, median over blocks: with every index, with only `_id`, and harel's MongoStore doing the "
        "same operation in the same blocks. An index's cost is the median, over blocks, of the time with "
        "every index minus the time with all but that one, measured back to back in each block (noise: a "
        "few hundredths of a ms either way). *keys* is what the operation's writes do to the index's "
        "entries, counted from the documents after each write: entries removed plus entries added by a "
        "server that rewrites every entry of a changed document (SecantusDB) / by one that writes only "
        "the entries that change (mongod)."
    )
    lines.append("")
    lines.append(
        "| operation | harel MongoStore, ms | harel-beanie, every index, ms | harel-beanie, `_id` only, ms | the index set, ms |"
    )
    lines.append("|---|---:|---:|---:|---:|")
    for kind, what in COMMIT_KINDS.items():
        lines.append(
            f"| {kind}: {what} | {costs['harel'][kind]:.2f} | {costs['all'][kind]:.2f} | "
            f"{costs['none'][kind]:.2f} | {costs['cost_all'][kind]:+.2f} |"
        )
    return lines


def _index_costs(run: ServerRun) -> list[str]:
    """Per index: the ms it adds to each commit kind, and the keys that kind writes to it."""
    if not run.index_costs:
        return []
    lines = ["", "Per index: ms it adds, and keys written (SecantusDB / mongod), per operation.", ""]
    lines.append("| index | serves | " + " | ".join(COMMIT_KINDS) + " |")
    lines.append("|---|---|" + "---:|" * len(COMMIT_KINDS))
    for ix in index_models(ExecutionDocument):
        name = ix.document["name"]
        cost = run.index_costs.get(f"cost-{name}")
        if cost is None:
            continue
        keys = ", ".join(f"{k} {v}" for k, v in dict(ix.document["key"]).items())
        extra = " sparse" if ix.document.get("sparse") else ""
        extra += " partial" if ix.document.get("partialFilterExpression") else ""
        cells = []
        for kind in COMMIT_KINDS:
            every, changed = run.keys.get(kind, {}).get(name, (0, 0))
            cells.append(f"{cost[kind]:+.2f} ms, {every} / {changed} keys")
        lines.append(
            f"| `{name}` ({keys}){extra} | {INDEX_PURPOSE.get(name, '(not described)')} | " + " | ".join(cells) + " |"
        )
    return lines


def report(runs: list[ServerRun], opts: Options, started: datetime.datetime, wall: float) -> str:
    m = machine()
    lines = ["# Benchmark results", ""]
    lines.append(
        f"Run {started:%Y-%m-%d %H:%M} UTC with `python -m bench.store.run"
        + (" --quick" if opts.quick else "")
        + f"` in {wall / 60:.1f} min."
    )
    lines.append(
        f"Machine: {m['cpus']} CPUs, {m['cpu']}; {m['os']}; Python {m['python']}; harel {m['harel']}, "
        f"pymongo {m['pymongo']}, motor {m['motor']}, beanie {m['beanie']}."
    )
    lines.append(
        f"Per measurement: up to {opts.events} events or {opts.seconds:g} s; {opts.rounds} round(s); "
        f"workload models/bench/parcel.stm ({EVENTS_PER_EXECUTION} events per execution), each runner untraced (harel's "
        "default) and traced (`trace=True`, one trace step per commit); each store built with "
        "its own `from_url` and defaults (harel-beanie writes with w: majority, j: true; harel's store with "
        "the client default, w:1), and harel-beanie once more at w:1 on the empty database (equal write concern)."
    )
    for run in runs:
        lines += ["", report_server(run)]
    return "\n".join(lines) + "\n"
