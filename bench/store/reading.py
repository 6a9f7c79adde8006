"""The reading of one server's figures (the report's "Reading these figures"): what explains the
ratios, each paragraph in the run's own numbers and left out where the run lacks its figures.
Apart from bench/store/report.py's tables because it argues from them rather than showing them;
built from the ServerRun alone, so nothing here talks to a server or times anything."""

from __future__ import annotations

import math
import os
import statistics
from typing import Optional

from bench.common.harness import BARE, OWN, RUNNER_LABEL, RUNNERS, TRACED, ServerRun
from harel_beanie.core.documents import ExecutionDocument, index_models


def _x(ratio: Optional[float]) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def reading(run: ServerRun) -> list[str]:
    """What explains the ratios, in this run's own numbers: one paragraph per finding."""
    out = [_cost_model(run)]
    out += _index_share(run)
    out += _round_trips(run)
    out += _commit(run)
    out += _workers(run)
    for runner in ("worker-1", "worker-1" + TRACED):
        out += _one_at_a_time(run, runner)
    for runner in ("worker-16", "worker-16" + TRACED):
        out += _in_flight(run, runner)
    out.append(
        "- A database in use. harel's store answers the relay's reads (pending outbox entries and spawns) by "
        "reading every execution document, and the DurableRunner relays after every event, so its rate falls "
        f"with the {run.stored:,} stored. This store's reads follow pending work through its indexes, and its "
        "rate holds (the *stored / empty* column)."
    )
    out.append(
        "- What was tried for a runner below its target, each lever measured, and what bounds it: "
        "[LEVERS.md](LEVERS.md), written by hand from these runs and from micro-benchmarks."
    )
    return out


def _cost_model(run: ServerRun) -> str:
    """The bare update's rate with and without this store's indexes."""
    seq = statistics.mean(c[0] for c in run.ceiling)
    indexed = statistics.mean(c[2] for c in run.ceiling)
    return (
        f"- The server's cost model. A bare update by `_id` runs at {seq:,.0f}/s on a collection with only `_id`, "
        f"and at {indexed:,.0f}/s on one carrying this store's {len(index_models(ExecutionDocument))} indexes, "
        "although it changes no indexed field. "
        + (
            "This server maintains and plans over every secondary index on every write (mongod only rewrites "
            "the keys that change), so each index this store declares is paid on every commit, insert and ack "
            "here, whatever the commit changes. harel's store has no secondary index to pay for."
            if run.name == "embedded"
            else ""
        )
    )


def _index_share(run: ServerRun) -> list[str]:
    """Each runner's ratio with only `_id`, with only its own reads' indexes, and with all."""
    bare = [(r, run.ratio(r, "empty", BARE), run.ratio(r, "empty")) for r in RUNNERS]
    bare = [(r, z, x) for r, z, x in bare if z is not None and x is not None]
    if not bare:
        return []
    return [
        "- The indexes' share. With only `_id`, against harel's on an empty database (with its indexes in "
        "brackets): "
        + "; ".join(f"{RUNNER_LABEL[r]} {z:.2f}x ({x:.2f}x)" for r, z, x in bare)
        + ". With only the two indexes its own operations read: "
        + "; ".join(f"{RUNNER_LABEL[r]} {_x(run.ratio(r, 'empty', OWN))}" for r, _, _ in bare)
        + ". Where a runner reaches its target only with fewer indexes, the index set (the tables at the end) "
        "is what this server makes every write pay; the listing and dashboard indexes are needed by the "
        "reads this store promises, so they stay."
    ]


def _round_trips(run: ServerRun) -> list[str]:
    """The DurableRunner's round trips per event on each store, untraced and traced."""
    hp, bp = run.calls("durable", "empty", "harel"), run.calls("durable", "empty", "beanie")
    ht, bt = run.calls("durable" + TRACED, "empty", "harel"), run.calls("durable" + TRACED, "empty", "beanie")
    if not (hp and bp and ht and bt):
        return []
    return [
        f"- Round trips. With the DurableRunner, {hp[0]:.1f} per event on harel's store and {bp[0]:.1f} on this "
        f"one untraced, {ht[0]:.1f} and {bt[0]:.1f} traced: this store answers a relay pass (pending spawns, then "
        "pending outbox entries) with one read where harel's makes two, and takes no counter round trip for a "
        "trace step."
    ]


def _commit(run: ServerRun) -> list[str]:
    """A state-only commit's cost on harel's store, on this one, and on this one with only `_id`."""
    if not run.index_costs:
        return []
    h, a, n = run.index_costs["harel"], run.index_costs["all"], run.index_costs["none"]
    return [
        f"- The commit. A state-only commit costs {h['state']:.2f} ms on harel's store, {a['state']:.2f} ms on this "
        f"one with its {len(index_models(ExecutionDocument))} indexes and {n['state']:.2f} ms with only `_id` (the "
        "table at the end): the indexes the listing and dashboard reads need are what a commit pays here."
    ]


def _workers(run: ServerRun) -> list[str]:
    """A worker's round trips to the transport against those to the store."""
    w = run.calls("worker-1", "empty", "harel")
    if w is None:
        return []
    return [
        f"- Workers. An AsyncWorker event also makes about {w[1]:.1f} round trips to harel's Mongo transport "
        f"(claim, lock, read, ack), the same for both stores, against {w[0]:.1f} to the store: the transport "
        "sets the pace, so a cheaper store moves the worker figures less than the DurableRunner's."
    ]


def _one_at_a_time(run: ServerRun, runner: str) -> list[str]:
    """Where a sequential runner's event time goes, as differences to harel's store."""
    sh, sz, sb = (run.split(runner, "empty", k) for k in ("harel", BARE, "beanie"))
    if sh is None or sb is None:
        return []
    d = {k: sb[k] - sh[k] for k in sb}
    text = (
        f"- Where the {RUNNER_LABEL[runner]}'s time goes (the time table above). An event takes "
        f"{sb['wall']:.2f} ms on this store against {sh['wall']:.2f} ms on harel's ({d['wall']:+.2f}): its "
        f"commits {d['store update']:+.2f} ms, the store's other commands {d['store'] - d['store update']:+.2f}, "
        f"the transport's commands {d['transport']:+.2f} and the client's own work {d['client']:+.2f}. The "
        "commits' difference alone would make the ratio "
        f"{sh['wall'] / (sh['wall'] + d['store update']):.2f}x; measured, {_x(run.ratio(runner, 'empty'))}."
    )
    if sz is not None:
        text += (
            f" With only `_id` the commits take {sz['store update'] - sh['store update']:+.2f} ms against "
            f"harel's, so the index set is {sb['store update'] - sz['store update']:.2f} ms of each event's "
            "commit."
        )
    if sz is not None and not any(math.isnan(x["server cpu"]) for x in (sh, sz, sb)):
        text += (
            f" The server's CPU per event: {sh['server cpu']:.2f} ms for harel's store, "
            f"{sz['server cpu']:.2f} ms for this one with only `_id` and {sb['server cpu']:.2f} ms with its "
            f"indexes: the index set adds {sb['server cpu'] - sz['server cpu']:.2f} ms, and with the commands "
            "going one at a time, the server's work is on each event's path."
        )
    return [text]


def _in_flight(run: ServerRun, runner: str) -> list[str]:
    """With commands in flight, the CPU the client and server spend per event on each store."""
    sh, sz, sb = (run.split(runner, "empty", k) for k in ("harel", BARE, "beanie"))
    if sh is None or sz is None or sb is None or any(math.isnan(x["server cpu"]) for x in (sh, sz, sb)):
        return []
    cpu = {k: x["client cpu"] + x["server cpu"] for k, x in (("harel", sh), (BARE, sz), ("beanie", sb))}
    return [
        f"- The {RUNNER_LABEL[runner]}: the commands overlap, and the client and the server share this "
        f"machine's {os.cpu_count()} CPUs. Their CPU per event, client + server: {cpu['harel']:.2f} ms for "
        f"harel's store, {cpu[BARE]:.2f} ms for this one with only `_id` and {cpu['beanie']:.2f} ms with its "
        f"indexes (the server's part {sh['server cpu']:.2f}, {sz['server cpu']:.2f} and "
        f"{sb['server cpu']:.2f} ms). Were the CPUs the bound, the ratio would be "
        f"{cpu['harel'] / cpu['beanie']:.2f}x; measured, {_x(run.ratio(runner, 'empty'))}."
    ]
