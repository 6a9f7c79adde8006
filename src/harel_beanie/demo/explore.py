"""`harel-beanie demo --models DIR`: a user's own `*.stm` models, run the way the shop is.

Why this module exists: the shop's run (`harel_beanie.demo.run`) follows a script written
for its models' events and contexts; a user's models have their own. This run reads what
it needs from the compiled definitions instead: for each machine, a context that fits its
declared `context` schema (defaults kept; a required field gets a value of its type; the
list a `for ... in` fan-out walks gets two entries), executions created with it, then
rounds of driving: each execution still going gets one event its active state's
transitions accept (a different transition for different executions and rounds, its data
made to fit the event's declaration and the transition's guard where the guard is on the
event), the work settles, and the clock jumps to the next armed timer if one falls before
the run's end. It stops when nothing is left to send or fire, or after `ROUNDS`.

A machine it cannot start (its context refused, say) is named in one line and skipped;
the report is the shop's, with each machine's executions judged by whether they ran
without an error (a FAILED execution is the model's action raising, shown as such).
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any, Optional

from harel.definition.events import RESERVED_EVENTS, FieldSpec
from harel.definition.model import Definition, Node, Predicate, Transition, ancestors
from harel.spec.states import Event

from harel_beanie.demo.run import Demo
from harel_beanie.demo.tally import final_state
from harel_beanie.deploy.loader import load_models
from harel_beanie.harness.drivers import ManualClock, next_fire

#: rounds of events (and timers) at most: a model that cycles forever (a traffic light)
#: still ends its run
ROUNDS = 12
#: the model time the run replays, ending at the real time it started: the last hour, the
#: hour the dashboard's charts draw (a timer armed past its end is left armed)
SPAN = 3_600.0
#: a value of each declared type, for a required field with no default
EXAMPLE: dict[str, Any] = {"string": "demo", "int": 1, "float": 1.0, "bool": False, "any": "demo"}


def context_for(definition: Definition) -> dict[str, Any]:
    """A context that fits `definition`'s declared schema: defaults left to the engine,
    required fields given a value of their type, a fan-out's collection two entries."""
    fans = {n.invoke_each[1] for n in definition.index.values() if n.invoke_each is not None}
    out: dict[str, Any] = {}
    for name, spec in definition.context_schema.items():
        if name in fans:
            out[name] = ["demo-1", "demo-2"]
        elif spec.required and spec.default is None:
            out[name] = EXAMPLE.get(spec.type, "demo")
    for name in fans - set(out):  # an untyped context still needs the list it fans over
        out[name] = ["demo-1", "demo-2"]
    return out


def accepted(definition: Definition, active_path: Optional[str]) -> list[Transition]:
    """The transitions an event can take from the active leaf `active_path`: those of its
    scopes whose source is the leaf or one of its ancestors, on a kind the user sends (not
    one of the engine's own: `Timeout`, `Finished`, ...)."""
    leaf = definition.get(active_path or "")
    if leaf is None:
        return []
    chain: list[Node] = [leaf, *ancestors(leaf)]
    return [
        t
        for scope in chain
        for t in scope.transitions
        if t.event_filter is not None and t.source in chain and _kinds(t) and t.target is not None
    ]


def _kinds(t: Transition) -> list[str]:
    assert t.event_filter is not None
    return [k.strip() for k in t.event_filter.kind.split("|") if k.strip() not in RESERVED_EVENTS]


def event_for(definition: Definition, t: Transition, eid: str, n: int) -> Event:
    """An event transition `t` accepts: its first kind, data that fits the kind's declared
    fields and the guard's conditions on the event."""
    assert t.event_filter is not None
    kind = _kinds(t)[0]
    data: dict[str, Any] = {}
    for key, value in t.event_filter.predicates.items():
        name, op = key.split("__") if "__" in key else (key, "eq")
        data[name] = _satisfying(op, value)
    if t.event_filter.predicate is not None:
        _fit(t.event_filter.predicate, data)
    declared = definition.events.get(kind)
    fields: dict[str, FieldSpec] = declared.fields if declared is not None else {}
    for name, spec in fields.items():
        if name not in data and spec.required and spec.default is None:
            data[name] = EXAMPLE.get(spec.type, "demo")
    return Event(id=f"{eid}:explore:{n}", kind=kind, data=data)


def _fit(pred: Predicate, data: dict[str, Any]) -> None:
    """Set the event fields `pred` compares with a literal so that it holds (all of an
    `all`, the first of an `any`; a `not` or a comparison with the context is left)."""
    if pred.node == "leaf" and pred.source == "event" and pred.value_ref is not None:
        return
    if pred.node == "leaf" and pred.source == "event" and pred.field is not None and pred.op is not None:
        data[pred.field] = _satisfying(pred.op, pred.value)
    elif pred.node == "all":
        for child in pred.children:
            _fit(child, data)
    elif pred.node == "any" and pred.children:
        _fit(pred.children[0], data)


def _satisfying(op: str, value: Any) -> Any:
    """A value `op value` holds for."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if op in ("gt", "ne") and number:
        return value + 1
    if op == "lt" and number:
        return value - 1
    if op == "ne":
        return f"not {value}"
    if op == "in":
        return next(iter(value), None)
    return value  # eq, le, ge


class Explore(Demo):
    """A run of the machines in a user's folder (see the module's docstring)."""

    def __init__(self, target: Any, models: Path, executions: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(target, models, executions, *args, **kwargs)
        self.loaded = load_models(models)
        self.clock = ManualClock(start=self.end - SPAN)
        self.skipped: dict[str, str] = {}
        each = max(1, -(-executions // max(1, len(self.loaded))))
        machines = sorted(self.loaded)
        self.machine_of = {
            f"{self.run_id}-{m.lower().replace('.', '-')}-{i:04d}": m for m in machines for i in range(each)
        }
        self.planned = len(self.machine_of)
        self.sent = 0
        self.stood: dict[str, str] = {}  # the roots still going at the end: the state each stood in

    def definitions(self) -> dict[str, Any]:
        return self.loaded

    def root_ids(self) -> list[str]:
        return [eid for eid, m in self.machine_of.items() if m not in self.skipped]

    def ending(self, eid: str, doc: dict[str, Any]) -> tuple[str, str, str, bool]:
        """How a machine's execution ended: its final state, or the state it stood in when
        the run stopped it; judged by whether it ran without an error."""
        status = doc.get("status") or "missing"
        where = f"{self.stood[eid]}, still going" if eid in self.stood else final_state(doc)
        return self.machine_of[eid], "no error", where, status not in ("FAILED", "missing")

    async def _script(self, sender: Any) -> None:
        self._phase("creating executions")
        for machine in sorted(self.loaded):
            mine = [eid for eid, m in self.machine_of.items() if m == machine]
            try:
                for eid in mine:
                    await sender.create(machine, context_for(self.loaded[machine]), execution_id=eid)
            except (ValueError, TypeError) as exc:  # harel's refusal of the context, say
                self.skipped[machine] = str(exc).splitlines()[0]
                self.console.print(
                    f"  skipped {machine}: the demo cannot start it by itself ({self.skipped[machine]})",
                    markup=False,
                    soft_wrap=True,  # one line, to read whole
                )
        await self.settle()
        for n in range(ROUNDS):
            moves = await self._moves(n)
            if moves:
                self._phase(f"round {n + 1}: {len(moves)} events")
                await asyncio.gather(*(sender.send(eid, event) for eid, event in moves))
                await self.settle()
            ahead = next_fire(await self.poll.due_timers(self.end), self.clock())
            if ahead is not None:
                self._phase(f"round {n + 1}: timers")
                self._move_clock(max(ahead, self.clock()))
                await self.settle()
            elif not moves:
                break
        await self._stop_the_rest(sender)
        await self._refresh()
        self._phase("done")
        await self.samples.take(until=self.end)

    async def _stop_the_rest(self, sender: Any) -> None:
        """Cancel the roots still going, noting where each stood: left running, their timers
        (armed on this run's clock) would fire into a later run that has not their models."""
        going = self.executions.find(
            {"_id": {"$in": self.root_ids()}, "status": {"$in": ["RUNNING", "PENDING"]}}, {"active_path": 1}
        )
        async for doc in going:
            self.stood[doc["_id"]] = final_state(doc)
        if self.stood:
            self._phase(f"cancelling {len(self.stood)} still going")
            for eid in self.stood:  # one at a time: a cancel relays inline, on this runner
                await sender.cancel(eid)
            await self.settle()

    async def _moves(self, n: int) -> list[tuple[str, Event]]:
        """One event for each execution of this run still going whose active state accepts one."""
        registry = self.workers[0].definitions
        going = self.executions.find(
            {"_id": {"$regex": f"^{self.run_id}-"}, "status": {"$in": ["RUNNING", "PENDING"]}},
            {"definition_id": 1, "active_path": 1},
        )
        moves = []
        async for k, doc in _numbered(going):
            definition = registry.get(doc["definition_id"])
            ts = accepted(definition, doc.get("active_path")) if definition is not None else []
            if ts:
                t = ts[(n + k) % len(ts)]
                self.sent += 1
                moves.append((doc["_id"], event_for(definition, t, doc["_id"], self.sent)))
        return moves


async def _numbered(cursor: Any) -> Any:
    counter = itertools.count()
    async for doc in cursor:
        yield next(counter), doc
