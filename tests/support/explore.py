"""A schedule explorer: several flows run one database call at a time, in every order up to a
bound, with a kill after any step, and invariants checked after every step.

Why this module exists: the state kept beside the executions (the counts, the partition
leases, prune's removals) is argued in numbered rules that hold only if every interleaving of
the flows that write it keeps them. Every store operation is a generator of calls
(`harel_beanie.core.calls`), so a test can hold each flow between two calls and choose which
one moves next: this module makes those choices systematically, against the real wire server.

How it explores (stateless, as model checkers of concurrent programs do):
- A schedule is a list of choices, each `("step", i)` (actor i makes its next call) or
  `("kill", i)` (actor i dies there: nothing after it is sent). A schedule runs from the start
  state (`reset`) each time: the flows are deterministic given what the database answers, so
  replaying the same choices replays the same run.
- Each run follows its prefix, then goes on without preempting (the actor that moved last
  moves again while it can, then the first one still going). Every point of the run it did
  not inherit from its prefix pushes the other choices it had there, as new prefixes.
- A preemption is a switch away from an actor that could have moved on; schedules with more
  than `preemptions` of them, or more than `kills` kills, are not explored. Bounding
  preemptions (rather than length) is what finds most concurrency bugs with few schedules:
  each needs only a couple of ill-timed switches. Past `limit` schedules the exploration
  stops, and `sample` more runs choose at random (seeded, the seed printed on failure).
- A bulk write is made one op a step: an unordered bulk write's ops are independent writes a
  server may interleave with anything else.
- After every step `check` runs (it raises AssertionError); after the last, `settle` (the
  recovery a killed process leaves to the next one, and the checks at quiescence).

A failure names its schedule as the steps made, each with the call it sent; the shortest
failing schedule found is reported first.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from pymongo.errors import PyMongoError

from harel_beanie.core import calls
from harel_beanie.core.calls import Flow
from harel_beanie.store.dispatch import FlowRun

Choice = tuple[str, int]


@dataclass
class Actor:
    """One flow of a schedule: `make` gives a fresh flow each run."""

    name: str
    make: Callable[[], Flow[Any]]


class _Runner:
    """One actor's flow in a run: the call it will make next (an op of a bulk write, one at a
    time), and how it ended."""

    def __init__(self, actor: Actor) -> None:
        self.name = actor.name
        self.flow = FlowRun(actor.make())
        self.ops: list[calls.Call] = []  # the call to make, or a bulk write's ops still to make
        self.in_bulk, self.bulk_total = False, 0
        self.seen: list[str] = []  # the replies it was given: with the flow, its whole state
        self.killed = False
        self.error: Optional[BaseException] = None
        self.finished = False
        self._advance()

    @property
    def live(self) -> bool:
        return not self.killed and not self.finished

    def key(self) -> tuple[Any, ...]:
        """What decides this actor's future: how it stands and what it was answered."""
        return (self.killed, self.finished, len(self.ops), hash(tuple(self.seen)))

    def _advance(self) -> None:
        try:
            c = self.flow.next_call()
        except AssertionError:
            raise  # an actor's own check (a reader's answer): the schedule's failure
        except Exception as exc:  # the operation's own outcome (a conflict), not the explorer's
            self.error, self.finished = exc, True
            return
        self.in_bulk, self.bulk_total = isinstance(c, calls.BulkWrite), 0
        if c is None:
            self.finished = True
        elif isinstance(c, calls.BulkWrite):
            self.ops = [dataclasses.replace(op, target=c.target) for op in c.ops]
            if not self.ops:
                self.flow.reply(0)
                self._advance()
        else:
            self.ops = [c]

    def step(self, execute: Callable[[calls.Call], Any]) -> calls.Call:
        """Make the next call (or op of a bulk write); the flow gets its reply once the whole
        call is made (a bulk write's: the sum of its ops' counts)."""
        c = self.ops.pop(0)
        try:
            reply = execute(c)
        except PyMongoError as exc:
            self.seen.append(type(exc).__name__)
            self.ops = []
            self.flow.fail(exc)
            self._advance()
            return c
        self.seen.append(repr(reply))
        if self.in_bulk:
            self.bulk_total += int(reply or 0)
            reply = self.bulk_total
        if not self.ops:
            self.flow.reply(reply)
            self._advance()
        return c


@dataclass
class Step:
    """One step of a run, as a failure prints it."""

    choice: Choice
    actor: str
    call: Optional[calls.Call]

    def __str__(self) -> str:
        if self.choice[0] == "kill":
            return f"{self.actor}: killed"
        c = self.call
        what = type(c).__name__ if c is not None else "?"
        detail = getattr(c, "filter", None) or getattr(c, "pipeline", None) or ""
        return f"{self.actor}: {what} {getattr(c, 'target', '')} {str(detail)[:160]}"


class ScheduleFailed(AssertionError):
    """An invariant broken by a schedule: the steps that led there, and what broke."""

    def __init__(self, steps: list[Step], reason: str, seed: Optional[int] = None) -> None:
        self.steps, self.reason, self.seed = steps, reason, seed
        lines = [f"  {n:2}. {s}" for n, s in enumerate(steps, 1)]
        where = f" (random sample, seed {seed})" if seed is not None else ""
        super().__init__(
            f"a schedule of {len(steps)} steps{where} breaks an invariant:\n" + "\n".join(lines) + f"\n{reason}"
        )


@dataclass
class Report:
    """What an exploration did: schedules run (exhaustively within the bounds, then sampled),
    whether the bounded space was exhausted, and the failures found, shortest first."""

    schedules: int = 0
    sampled: int = 0
    exhausted: bool = False
    failures: list[ScheduleFailed] = field(default_factory=list)


@dataclass
class Explorer:
    """Explore the schedules of `actors` (2 to 4 flows) from the state `reset` restores:
    `execute` makes one call, `check(steps)` checks the invariants after each step, `settle()`
    runs at the end of each schedule."""

    actors: list[Actor]
    reset: Callable[[], None]
    execute: Callable[[calls.Call], Any]
    check: Callable[[list[Step]], None]
    settle: Callable[[], None]
    preemptions: int = 2
    kills: int = 1
    limit: int = 5000
    sample: int = 0
    seed: int = 0
    max_failures: int = 5
    #: the database's state (after `check`), to recognise a state met before: the flows are
    #: deterministic, so a state met again with no more budget left has no new future
    fingerprint: Optional[Callable[[], Any]] = None
    _met: dict[Any, list[tuple[int, int]]] = field(default_factory=dict)

    def run(self) -> Report:
        report = Report()
        todo: list[list[Choice]] = [[]]
        while todo and report.schedules < self.limit and len(report.failures) < self.max_failures:
            prefix = todo.pop()
            report.schedules += 1
            points, failure = self._one(prefix, None)
            if failure is not None:
                report.failures.append(failure)
            for k in range(len(prefix), len(points)):
                p = points[k]
                for alt in p.enabled:
                    if alt == p.choice:
                        continue
                    kills = p.kills + (alt[0] == "kill")
                    switch = alt[0] == "step" and alt[1] != p.current and p.current in p.live
                    if kills <= self.kills and p.preempted + switch <= self.preemptions:
                        todo.append([q.choice for q in points[:k]] + [alt])
        report.exhausted = not todo
        rng = random.Random(self.seed)
        for _ in range(self.sample):
            if len(report.failures) >= self.max_failures:
                break
            seed = rng.randrange(2**32)
            report.sampled += 1
            _, failure = self._one([], random.Random(seed))
            if failure is not None:
                failure.seed = seed
                failure.args = (f"(random sample, seed {seed}) {failure.args[0]}",)
                report.failures.append(failure)
        report.failures.sort(key=lambda f: len(f.steps))
        return report

    def _one(self, prefix: list[Choice], rng: Optional[random.Random]) -> tuple[list[_Point], Optional[ScheduleFailed]]:
        """Run one schedule: its prefix, then no preemption (or, with `rng`, random choices)."""
        self.reset()
        runners = [_Runner(a) for a in self.actors]
        points: list[_Point] = []
        steps: list[Step] = []
        current, kills, preempted = 0, 0, 0
        while any(r.live for r in runners):
            live = tuple(i for i, r in enumerate(runners) if r.live)
            enabled: list[Choice] = [("step", i) for i in live]
            if kills < self.kills:
                enabled += [("kill", i) for i in live]
            if len(points) < len(prefix):
                choice = prefix[len(points)]
            elif rng is not None:
                kill_now = kills < self.kills and rng.random() < 0.05
                choice = ("kill" if kill_now else "step", rng.choice(live))
            else:
                choice = ("step", current if current in live else live[0])
            points.append(_Point(choice, enabled, current, live, kills, preempted))
            kind, i = choice
            if kind == "kill":
                runners[i].killed = True
                kills += 1
                steps.append(Step(choice, runners[i].name, None))
            try:
                if kind == "step":
                    preempted += i != current and current in live
                    current = i
                    steps.append(Step(choice, runners[i].name, runners[i].ops[0]))
                    runners[i].step(self.execute)
                self.check(steps)
            except AssertionError as exc:
                return points, ScheduleFailed(steps, str(exc))
            if rng is None and self.fingerprint is not None and len(points) >= len(prefix):
                if self._met_before(runners, current, self.preemptions - preempted, self.kills - kills):
                    return points, None  # explored from here already, with as much budget
        try:
            self.settle()
        except AssertionError as exc:
            return points, ScheduleFailed(steps, f"after the schedule and a settling fold: {exc}")
        return points, None

    def _met_before(self, runners: list[_Runner], current: int, preemptions: int, kills: int) -> bool:
        assert self.fingerprint is not None
        key = (self.fingerprint(), tuple(r.key() for r in runners), current)
        budgets = self._met.setdefault(key, [])
        if any(p >= preemptions and k >= kills for p, k in budgets):
            return True
        budgets.append((preemptions, kills))
        return False


@dataclass(frozen=True)
class _Point:
    """One point of a run: the choice made, the choices there were, and what bounds the
    alternatives (the actor that moved last, the live ones, kills and preemptions so far)."""

    choice: Choice
    enabled: list[Choice]
    current: int
    live: tuple[int, ...]
    kills: int
    preempted: int
