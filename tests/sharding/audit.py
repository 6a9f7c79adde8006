"""The targeting audit's recorder: every command a store, a transport, a partition owner and
a worker send, tagged with the public operation that sent it and classified by
`tests.sharding.targeting` against the shard plan.

`Labelled` wraps a store or transport (or anything with methods): each call of a public
method runs with `OP` set to its name, unless an outer operation set it already (a commit
inside harel's relay is the relay's). A PyMongo command listener is called in the task or
thread that sent the command, so the listener reads `OP` there and knows the operation.

The operations are sorted into the hot path (what a running deployment sends for every
event, claim and sweep) and the operator's (set-up, listing, purge: once, or on demand).
The audit fails on a hot-path command that reaches every shard, and on any command of either
kind that breaks a rule a sharded cluster enforces.

Some hot operations choose their partitions by what the process owns (`OWNED`: claims, the
timer sweep, the relay sweep, the counts fold). Given `owned` (what the audited process
holds, asked at each command), the audit also fails on one of those whose command can reach
a partition outside it: `part: {$in: [all 16]}` is partition-scoped to a mongos, yet a
worker owning 8 partitions that sends it reads every shard and another worker's share.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Optional

from pymongo import monitoring

from tests.sharding.targeting import ALL_SHARDS, ONE_SHARD, PARTITION_SCOPED, UNSHARDED, Classified, classify_event

OP: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("hb_audit_op", default=None)

#: what a deployment sends for every event, claim and sweep
HOT = {
    "load": "store",
    "load_for_event": "store",
    "is_processed": "store",
    "commit": "store",
    "save": "store",
    "append_trace": "store",
    "read_trace": "store",
    "pending_outbox": "store (relay)",
    "pending_spawns": "store (relay)",
    "ack_outbox": "store (relay)",
    "ack_spawn": "store (relay)",
    "due_timers": "store (timer sweep)",
    "next_timer": "store (idle wait)",
    "delete_timer": "store (timer sweep)",
    "publish": "transport",
    "claim": "transport",
    "ack": "transport",
    "nack": "transport",
    "tick": "partition leases",
    "sweep": "worker (relay sweep)",
    "fold_counts": "worker (counts fold)",
}
#: the hot operations that read or write the partitions the process owns, and no other: with
#: `Audit.owned` given, a command of theirs that can reach another partition is flagged
OWNED = frozenset({"claim", "due_timers", "next_timer", "sweep", "fold_counts"})
#: once, or on demand: the audit still fails on a broken rule, not on a broadcast
OPERATOR = {
    "init": "set-up",
    "list_executions": "store (listing)",
    "ids_with_prefix": "store (listing)",
    "purge": "store (purge)",
    "release": "partition leases",
    "close": "shutdown",
    "dashboard": "dashboard, metrics, status",
    "prune": "harel-beanie prune",
    "migrate-transport up": "harel-beanie migrate-transport",
    "migrate-transport down": "harel-beanie migrate-transport",
}

_ORDER = [ONE_SHARD, PARTITION_SCOPED, UNSHARDED, ALL_SHARDS]


class Labelled:
    """`inner`, each public method call tagged with its name in `OP`."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name.startswith("_") or not callable(attr):
            return attr
        if inspect.iscoroutinefunction(attr):

            @functools.wraps(attr)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                token = OP.set(name) if OP.get() is None else None
                try:
                    return await attr(*args, **kwargs)
                finally:
                    if token is not None:
                        OP.reset(token)

            return run_async

        @functools.wraps(attr)
        def run(*args: Any, **kwargs: Any) -> Any:
            token = OP.set(name) if OP.get() is None else None
            try:
                return attr(*args, **kwargs)
            finally:
                if token is not None:
                    OP.reset(token)

        return run


@dataclass
class Audit(monitoring.CommandListener):
    """Classifies every command sent on database `db_name`, by the operation that sent it.
    `owned`, when given, says which partitions the audited process owns when it is asked
    (None: every one, as a store without an owner): a process's `PartitionScope.owned`."""

    db_name: str
    prefix: str = "harel"
    owned: Optional[Callable[[], Optional[Collection[int]]]] = None
    seen: list[tuple[Optional[str], Classified, dict[str, Any]]] = field(default_factory=list)
    #: what `owned` answered when each command of `seen` started (same index)
    held: list[Optional[frozenset[int]]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        op = OP.get()
        owned = self.owned() if self.owned is not None else None
        held = None if owned is None else frozenset(owned)
        for c in classify_event(event, self.db_name, self.prefix):
            with self._lock:
                self.seen.append((op, c, dict(event.command)))
                self.held.append(held)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def problems(self) -> list[str]:
        """Hot-path broadcasts and broken rules (any operation), one line each."""
        out = []
        for (op, c, command), held in zip(self.seen, self.held):
            if c.violations:
                out.append(f"{op}: {c.command} on {c.collection}: {'; '.join(c.violations)}")
            elif c.kind == ALL_SHARDS and (op in HOT or op is None):
                out.append(f"{op}: {c.command} on {c.collection} reaches every shard ({c.detail}): {command}")
            elif (beyond := _beyond(op, c, held)) is not None:
                out.append(
                    f"{op}: {c.command} on {c.collection} reaches partitions {beyond} its process does not own "
                    f"(it owns {sorted(held or ())}): {command}"
                )
        return out

    def table(self) -> dict[str, dict[str, set[str]]]:
        """operation -> collection command -> the kinds it was seen as."""
        rows: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for op, c, _ in self.seen:
            rows[op or "(none)"][f"{c.command} {c.collection}"].add(c.kind)
        return rows


def _beyond(op: Optional[str], c: Classified, held: Optional[frozenset[int]]) -> Optional[str]:
    """The partitions an `OWNED` operation's command can reach and its process did not own
    when it sent it (None when it reaches none of them, or nothing is known of what it owns).
    A document without `part` is partition 0's (`PartitionScope.sweep_filter`)."""
    if op not in OWNED or held is None or c.kind == UNSHARDED:
        return None
    if c.parts is None:
        return "all"
    reached = {0 if p is None else p for p in c.parts}
    outside = sorted(reached - held, key=lambda p: (not isinstance(p, int), p if isinstance(p, int) else repr(p)))
    return None if not outside else str(outside)


def markdown(tables: list[dict[str, dict[str, set[str]]]], prefix: str = "harel") -> str:
    """The operation table of docs/SCALING.md, from one or more audits' tables."""
    merged: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for table in tables:
        for op, commands in table.items():
            for command, kinds in commands.items():
                merged[op][command] |= kinds
    lines = [
        "| operation | path | command and collection | where it goes on a cluster |",
        "|---|---|---|---|",
    ]
    order = list(HOT) + list(OPERATOR)
    for op in sorted(merged, key=lambda o: (order.index(o) if o in order else len(order), o)):
        path = f"hot: {HOT[op]}" if op in HOT else f"operator: {OPERATOR.get(op, 'other')}"
        for command in sorted(merged[op]):
            kinds = sorted(merged[op][command], key=_ORDER.index)
            shown = command.replace(f"{prefix}_", "<prefix>_")
            lines.append(f"| `{op}` | {path} | `{shown}` | {', '.join(kinds)} |")
    return "\n".join(lines) + "\n"
