"""The report's sections on the production stacks: each store on its own transport side by
side, the transports' round trips per message, event-to-handler latency and timer lateness,
and where the client's time goes per event. Built from the ServerRun the measurements filled;
nothing here talks to a server or times anything."""

from __future__ import annotations

import math
from typing import Optional

from bench.common.harness import LABEL, RUNNER_LABEL, STACK_RUNNERS, STACK_TARGET, STACKS, STATES, ServerRun
from bench.stack.cost import cost_section
from bench.stack.latency import summary


def _f(x: Optional[float], digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def stack_section(run: ServerRun) -> list[str]:
    if not any(c.store in STACKS for c in run.cells):
        return []
    harel, ours = STACKS
    lines = ["", "### The stacks side by side", ""]
    lines.append(
        f"{LABEL[ours]} against {LABEL[harel]}, harel's `AsyncWorker` driving both, the same waves of "
        "work (events/s, the median of the rounds; the ratio is the median of each round's ratio). "
        f"Target: at least {STACK_TARGET}x in every row."
    )
    lines += [
        "",
        f"| runner | database | {LABEL[harel]} | {LABEL[ours]} | ratio | target |",
        "|---|---|---:|---:|---:|---|",
    ]
    for runner in STACK_RUNNERS:
        for state in STATES:
            ratio = run.ratio(runner, state, ours, harel)
            met = "-" if ratio is None else ("met" if ratio >= STACK_TARGET else "not met")
            lines.append(
                f"| {RUNNER_LABEL[runner]} | {state} | {_f(run.rate(runner, state, harel))} | "
                f"{_f(run.rate(runner, state, ours))} | {_f(ratio, 2)}x | {met} |"
            )
    lines += ["", "Round trips per event in those rows (store / transport):", ""]
    lines += [f"| runner | database | {LABEL[harel]} | {LABEL[ours]} |", "|---|---|---:|---:|"]
    for runner in STACK_RUNNERS:
        for state in STATES:
            cells = [run.calls(runner, state, kind) for kind in STACKS]
            shown = ["-" if c is None else f"{c[0]:.2f} / {c[1]:.2f}" for c in cells]
            lines.append(f"| {RUNNER_LABEL[runner]} | {state} | {shown[0]} | {shown[1]} |")
    if run.trips:
        lines += ["", "### Round trips per message, each transport", ""]
        lines.append("Commands sent per message, one group per message (each execution with one message waiting):")
        lines += ["", "| operation | harel's AsyncMongoTransport | harel-beanie's transport |", "|---|---:|---:|"]
        for op in ("publish", "claim", "ack"):
            lines.append(f"| {op} | {run.trips['harel'][op]:.2f} | {run.trips['beanie'][op]:.2f} |")
    lines += _latency(run)
    lines += _profile(run)
    lines += cost_section(run)
    return lines


def _latency(run: ServerRun) -> list[str]:
    if not run.latencies:
        return []
    lines = ["", "### Event-to-handler latency and timer lateness", ""]
    lines.append(
        "An idle worker (harel's `AsyncWorker.run`, concurrency 16); Parcels started one at a time at 10/s: "
        "the time from each Start's publish to the worker's claim of it. Then Waiters, each arming a 1 s "
        "durable timer: the time from its fire time to the claim of its Timeout. And what the idle worker "
        "sends the server per second (serverStatus opcounters, before any work). Wall-clock figures of this "
        "machine, from one run: compare the rows, not the numbers across machines."
    )
    lines += [
        "",
        "| setup | handler p50 ms | p99 ms | max ms | timer lateness p50 ms | p99 ms | idle commands/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for lat in run.latencies:
        p50, p99, top = summary(lat.handler_ms)
        t50, t99, _ = summary(lat.timer_ms)
        lines.append(
            f"| {lat.label} | {_f(p50)} | {_f(p99)} | {_f(top)} | {_f(t50)} | {_f(t99)} | {_f(lat.idle_commands_per_s)} |"
        )
    return lines


def _profile(run: ServerRun) -> list[str]:
    if not run.profile:
        return []
    lines = ["", "### Where the client's time goes per event", ""]
    lines.append(
        "Each store under harel's transport, `AsyncWorker` at concurrency 1, profiled with cProfile: the "
        "functions with the most time of their own, ms per event (the profiler's overhead included, alike "
        "for both)."
    )
    for kind in ("harel", "beanie"):
        rows = run.profile.get(kind, [])
        total = math.fsum(ms for _, ms in rows)
        lines += [
            "",
            f"{LABEL[kind]} (these {len(rows)}: {total:.2f} ms per event):",
            "",
            "| function | ms per event |",
            "|---|---:|",
        ]
        lines += [f"| `{name}` | {ms:.3f} |" for name, ms in rows]
    return lines
