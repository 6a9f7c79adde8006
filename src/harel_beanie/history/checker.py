"""The checker: what a recorded history must satisfy for nothing to have been lost or doubled.

Why this module exists: a fault run proves something only if its outcome is judged by rules
written once, independent of the faults injected. `check(records)` reads nothing and writes
nothing: it takes the records (`harel_beanie.history.records.read_history`), and optionally a
`replay` callable, and returns a `Verdict` (`harel_beanie.history.verdict`) listing every
anomaly it finds, each of a kind in `KINDS`, with the execution and a readable detail.

The fields it reads, by operation (`t`, `p`, `i`, `type`, `f` on all of them):

- `create` — invoke: `exe`, `definition`, `context`, `parent`; ok: `version` (1);
- `commit` — invoke: `exe`, `from`, `to` (= from + 1), `event`; ok: `to`; fail: `found`;
- `read` — invoke: `exe`; ok: `version` (null: no such execution);
- `send` — invoke: `exe`, `event` (its id), `kind`, `data`;
- `publish` — invoke: `group`, `event` (its id), `kind` (the transport's publish);
- `deliver` — invoke: `group`, `event`, `kind`, written as a claim hands the message over;
  ok: acked (handled), fail: nacked (it comes back);
- `final` (ok, alone, once an execution's work has drained): `exe`, `definition`, `parent`,
  `version`, `status`, `active_path`, `context`, `deferred` (a count);
- `drain` (ok, alone, once): `outbox`, `spawns`, `timers`, `queued`, `leased` (counts).

The model under test records its effects in its context: each event it applies appends the
event's id to a list (`seen`), so the final context is the record of what was applied. The
history must cover each execution from its creation (every process that writes to the store
records), and every event sent to it.

Rules (each anomaly kind is named where its rule is):

1. Events. An event sent to an execution whose send was acknowledged (any send of that id
   returned ok) is in the final `seen` exactly once (`lost`, `doubled`). One whose sends all
   ended unknown or incomplete is there at most once (`doubled`). One whose every send failed
   is not there, nor is an id never sent (`phantom`).
2. Versions, per execution: an acknowledged commit moved the version by one (`skipped-version`);
   no two acknowledged writes landed on one version (`same-version`); the final version is not
   below an acknowledged one (`lost-ack`: a write acknowledged, then gone, as after a restart
   below the write concern); each version up to the final one is claimed by a create or commit
   that may have landed — ok, unknown or incomplete (`unaccounted-version`).
3. Reads: a read invoked after a write of the same execution was acknowledged sees that
   version or a later one, and a created execution exists (`stale-read`).
4. Final states: a root execution's final status, active state, context and children equal
   `replay`'s run of its accepted events, in the order `seen` holds them (`replay-mismatch`).
5. The end: the `drain` record counts nothing left in the outbox, spawns, timers, transport or
   leases, and no execution still holds deferred events (`not-drained`); the drain was
   recorded, and every execution created, written or sent to has a final record (`no-final`).
6. Order, per group: harel's transport is one FIFO per group (a group is an execution), one
   message of it in flight. So an event whose publish to a group was acknowledged before
   another's first publish to that group began is delivered first (`reordered`): the
   other's first delivery does not come before its own, nor without it. And, for a group
   that is an execution with a final record, it is applied first: earlier in `seen`
   (`reordered`), when both are listed there. Publishes that overlap in time have no order to keep, and a message's
   later copies (a resend, a relay's second publish) none of their own: the first publish
   and the first delivery of each event id are what is compared.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

from harel_beanie.core.arguments import require_str
from harel_beanie.history.records import OUTCOMES, Operation, Paired, pair
from harel_beanie.history.verdict import Anomaly, Verdict
from harel_beanie.history.wording import diff, listed, ranges, times

#: the counts of the `drain` record; each must be 0
DRAIN_FIELDS = ("outbox", "spawns", "timers", "queued", "leased")
#: what a replay returns and a root's final record is compared on
COMPARED = ("status", "active_path", "context", "children")

Event = tuple[str, str, dict[str, Any]]


@dataclass(frozen=True)
class ReplayCase:
    """What a replay runs: root execution `exe` created as `definition` with `context` (as
    its create was recorded), then sent `events`, `(id, kind, data)`, in the order they were
    applied. The id is part of it because harel names children after their parent."""

    exe: str
    definition: str
    context: dict[str, Any]
    events: list[Event]


#: `replay(case)`: the case run again; returns `COMPARED` (`children`: id -> status)
Replay = Callable[[ReplayCase], Mapping[str, Any]]


def check(records: Iterable[Mapping[str, Any]], replay: Optional[Replay] = None, *, seen: str = "seen") -> Verdict:
    """Judge `records` by the module's rules; `seen` names the context field listing the ids
    of the events applied. Without `replay`, final states are not compared (rule 4)."""
    seen = require_str("seen", seen)  # before the records are read: they may be a one-pass iterator
    h = _History(pair(records), seen)
    replayed: list[int] = [0, 0]  # replayed, skipped
    anomalies = [
        *_events(h),
        *_versions(h),
        *_reads(h),
        *([] if replay is None else _final_states(h, replay, replayed)),
        *_end(h),
        *_order(h),
    ]
    return Verdict(anomalies, _figures(h, replayed))


class _History:
    """The paired history, indexed the ways the rules read it."""

    def __init__(self, paired: Paired, seen: str) -> None:
        self.paired = paired
        self.by_exe: dict[str, list[Operation]] = defaultdict(list)
        self.sends: dict[tuple[str, str], list[Operation]] = defaultdict(list)
        self.queued: dict[str, list[Operation]] = defaultdict(list)  # group -> its publishes and deliveries
        self.fifo_pairs = 0
        for op in paired.operations:
            if op.f in ("publish", "deliver") and op.invoke.get("group") is not None:
                self.queued[str(op.invoke["group"])].append(op)
                continue
            if op.exe is None:
                continue
            self.by_exe[op.exe].append(op)
            if op.f == "send":
                self.sends[(op.exe, str(op.invoke.get("event")))].append(op)
        self.finals: dict[str, Mapping[str, Any]] = {}
        self.drains: list[Mapping[str, Any]] = []
        for rec in paired.standalone:
            if rec["f"] == "final":
                self.finals[str(rec.get("exe"))] = rec  # the last word, should one be written twice
            elif rec["f"] == "drain":
                self.drains.append(rec)
        self.seen: dict[str, list[str]] = {}
        for exe, final in self.finals.items():
            listed = (final.get("context") or {}).get(seen)
            self.seen[exe] = [str(x) for x in listed] if isinstance(listed, list) else []

    def writes(self, exe: str) -> list[Operation]:
        return [op for op in self.by_exe.get(exe, ()) if op.f in ("create", "commit")]


# --- 1. events ----------------------------------------------------------------------------


def _events(h: _History) -> Iterable[Anomaly]:
    for (exe, eid), sends in h.sends.items():
        if exe not in h.finals:
            continue  # `no-final` says so; there is nothing to count in
        n = h.seen[exe].count(eid)
        outcomes = Counter(op.outcome for op in sends)
        tried = ", ".join(f"{k} {outcomes[k]}" for k in OUTCOMES if outcomes[k])
        if outcomes["ok"]:
            if n == 0:
                yield Anomaly("lost", exe, f"event {eid!r} was acknowledged (sends: {tried}) and never applied")
            elif n > 1:
                yield Anomaly("doubled", exe, f"event {eid!r} applied {n} times (sends: {tried})")
        elif any(op.uncertain for op in sends):
            if n > 1:
                yield Anomaly("doubled", exe, f"event {eid!r} of unknown outcome applied {n} times (sends: {tried})")
        elif n:
            yield Anomaly("phantom", exe, f"event {eid!r} applied {times(n)} though every send failed ({tried})")
    for exe, ids in h.seen.items():
        for eid in dict.fromkeys(ids):
            if (exe, eid) not in h.sends:
                yield Anomaly("phantom", exe, f"event {eid!r} applied {times(ids.count(eid))}, never sent")


# --- 2. versions --------------------------------------------------------------------------


def _landed(op: Operation) -> Optional[int]:
    """The version an acknowledged write says it stored."""
    assert op.completion is not None
    v = op.completion.get("version", 1) if op.f == "create" else op.completion.get("to")
    return v if isinstance(v, int) else None


def _claimed(op: Operation) -> Optional[int]:
    """The version a write may have stored: the one acknowledged, or the one it aimed at."""
    if op.outcome == "ok":
        return _landed(op)
    if op.uncertain:
        v = 1 if op.f == "create" else op.invoke.get("to")
        return v if isinstance(v, int) else None
    return None


def _name(op: Operation) -> str:
    what = f" for event {op.invoke['event']!r}" if op.invoke.get("event") is not None else ""
    return f"{op.f} {op.invoke['p']}#{op.invoke['i']}{what}"


def _versions(h: _History) -> Iterable[Anomaly]:
    for exe in sorted(set(h.by_exe) | set(h.finals)):
        landed: dict[int, list[Operation]] = defaultdict(list)
        claimed: set[int] = set()
        for op in h.writes(exe):
            v = _claimed(op)
            if v is not None:
                claimed.add(v)
            if op.outcome != "ok" or v is None:
                continue
            landed[v].append(op)
            start = op.invoke.get("from")
            if op.f == "commit" and isinstance(start, int) and v != start + 1:
                yield Anomaly("skipped-version", exe, f"{_name(op)} went from version {start} to {v}")
        for v, ops in sorted(landed.items()):
            if len(ops) > 1:
                yield Anomaly(
                    "same-version",
                    exe,
                    f"version {v} acknowledged to {len(ops)} writes: " + ", ".join(_name(op) for op in ops),
                )
        final = h.finals.get(exe)
        if final is None or not isinstance(final.get("version"), int):
            continue
        version = int(final["version"])
        if landed and version < max(landed):
            yield Anomaly(
                "lost-ack",
                exe,
                f"version {max(landed)} was acknowledged ({_name(landed[max(landed)][0])}), "
                f"the execution ended at version {version}",
            )
        missing = [v for v in range(1, version + 1) if v not in claimed]
        if missing:
            yield Anomaly(
                "unaccounted-version",
                exe,
                f"no recorded write could have stored version(s) {ranges(missing)} of the final {version}",
            )


# --- 3. reads -----------------------------------------------------------------------------


def _reads(h: _History) -> Iterable[Anomaly]:
    for exe, ops in h.by_exe.items():
        acked = sorted(
            (
                (op.completed, v, op)
                for op in h.writes(exe)
                if op.outcome == "ok" and op.completed is not None and (v := _landed(op)) is not None
            ),
            key=lambda row: row[0],
        )
        if not acked:
            continue
        times = [t for t, _v, _op in acked]
        best: list[tuple[int, Operation]] = []  # the highest version acknowledged so far, at each
        for _t, v, op in acked:
            best.append((v, op) if not best or v > best[-1][0] else best[-1])
        for op in ops:
            if op.f != "read" or op.outcome != "ok" or op.completion is None:
                continue
            k = bisect.bisect_left(times, op.invoked)  # writes acknowledged strictly before the read began
            if k == 0:
                continue
            v, write = best[k - 1]
            got = op.completion.get("version")
            if got is None or (isinstance(got, int) and got < v):
                saw = "no execution" if got is None else f"version {got}"
                yield Anomaly(
                    "stale-read",
                    exe,
                    f"read {op.invoke['p']}#{op.invoke['i']} saw {saw}, invoked "
                    f"after version {v} was acknowledged ({_name(write)})",
                )


# --- 4. final states ----------------------------------------------------------------------


def _final_states(h: _History, replay: Replay, counted: list[int]) -> Iterable[Anomaly]:
    for exe, final in h.finals.items():
        if final.get("parent") is not None:
            continue  # compared as its root's child
        creates = [op for op in h.by_exe.get(exe, ()) if op.f == "create"]
        if not creates:
            continue  # created before the history began: no context to start from
        create = next((op for op in creates if op.outcome == "ok"), creates[0])
        ids = h.seen[exe]
        if len(set(ids)) != len(ids) or any((exe, eid) not in h.sends for eid in ids):
            counted[1] += 1  # doubled or phantom, already reported: no order of events to replay
            continue
        events: list[Event] = []
        for eid in ids:
            sent = h.sends[(exe, eid)][0].invoke
            events.append((eid, str(sent.get("kind")), dict(sent.get("data") or {})))
        definition = str(create.invoke.get("definition") or final.get("definition"))
        case = ReplayCase(exe, definition, dict(create.invoke.get("context") or {}), events)
        try:
            want = replay(case)
        except Exception as exc:  # a replay that cannot run says the history cannot be explained
            yield Anomaly("replay-mismatch", exe, f"the replay failed: {type(exc).__name__}: {exc}")
            continue
        counted[0] += 1
        got = {key: final.get(key) for key in COMPARED if key != "children"}
        got["children"] = {cid: f.get("status") for cid, f in h.finals.items() if f.get("parent") == exe}
        differs = diff(got, want, COMPARED)
        if differs:
            yield Anomaly("replay-mismatch", exe, f"after {len(events)} events: " + "; ".join(differs))


# --- 5. the end ---------------------------------------------------------------------------


def _end(h: _History) -> Iterable[Anomaly]:
    if not h.drains:
        yield Anomaly("no-final", None, "no drain record: the end of the run was never observed")
    else:
        left = {k: h.drains[-1].get(k) for k in DRAIN_FIELDS if h.drains[-1].get(k)}
        if left:
            yield Anomaly(
                "not-drained", None, "still pending at the end: " + ", ".join(f"{k} {v}" for k, v in left.items())
            )
    for exe, final in h.finals.items():
        deferred = final.get("deferred")
        if isinstance(deferred, int) and deferred > 0:
            yield Anomaly("not-drained", exe, f"{deferred} deferred events still held in {final.get('active_path')}")
    for exe, ops in h.by_exe.items():
        if exe not in h.finals and any(op.f != "read" for op in ops):
            kinds = Counter(op.f for op in ops if op.f != "read")
            yield Anomaly(
                "no-final",
                exe,
                "no final record for an execution with " + ", ".join(f"{n} {f}" for f, n in sorted(kinds.items())),
            )


# --- 6. order, per group -------------------------------------------------------------------


def _order(h: _History) -> Iterable[Anomaly]:
    for group, ops in sorted(h.queued.items()):
        acked: dict[str, int] = {}  # event -> when its first acknowledged publish returned
        began: dict[str, int] = {}  # event -> when its first publish began
        delivered: dict[str, int] = {}  # event -> when it was first handed to a worker
        for op in ops:
            eid = str(op.invoke.get("event"))
            if op.f == "publish":
                began[eid] = min(began.get(eid, op.invoked), op.invoked)
                if op.outcome == "ok" and op.completed is not None:
                    acked[eid] = min(acked.get(eid, op.completed), op.completed)
            else:
                delivered[eid] = min(delivered.get(eid, op.invoked), op.invoked)
        seen = h.seen.get(group)
        applied = {eid: n for n, eid in reversed(list(enumerate(seen)))} if seen is not None else {}
        firsts = sorted(acked.items(), key=lambda item: item[1])
        for later, start in sorted(began.items(), key=lambda item: item[1]):
            earlier = [eid for eid, done in firsts if done < start and eid != later]
            if later in delivered:
                h.fifo_pairs += len(earlier)
                jumped = [eid for eid in earlier if delivered.get(eid, delivered[later] + 1) > delivered[later]]
                if jumped:
                    yield Anomaly(
                        "reordered",
                        group,
                        f"event {later!r} was delivered before {listed(jumped)}, "
                        "whose publish was acknowledged before its own began",
                    )
            if later in applied:
                # only events the model lists: a Timeout or a child's Returned is applied unlisted
                jumped = [eid for eid in earlier if applied.get(eid, -1) > applied[later]]
                if jumped:
                    yield Anomaly(
                        "reordered",
                        group,
                        f"event {later!r} was applied before {listed(jumped)}, "
                        "whose publish was acknowledged before its own began",
                    )


# --- figures ------------------------------------------------------------------------------


def _figures(h: _History, replayed: list[int]) -> dict[str, Any]:
    ops = h.paired.operations
    by_f: dict[str, dict[str, int]] = {}
    for op in ops:
        per = by_f.setdefault(op.f, {})
        per[op.outcome] = per.get(op.outcome, 0) + 1
    faults = Counter(str(r.get("kind")) for r in h.paired.standalone if r["f"] == "fault")
    return {
        "operation_count": len(ops),
        "operations": by_f,
        "unknown": sum(op.outcome == "unknown" for op in ops),
        "incomplete": sum(op.outcome == "incomplete" for op in ops),
        "stray_completions": len(h.paired.strays),
        "processes": len({op.invoke["p"] for op in ops}),
        "executions": len(h.finals),
        "events_sent": len(h.sends),
        "events_applied": sum(len(ids) for ids in h.seen.values()),
        "replayed": replayed[0],
        "replay_skipped": replayed[1],
        "faults": dict(faults),
        "publishes": sum(op.f == "publish" for ops in h.queued.values() for op in ops),
        "deliveries": sum(op.f == "deliver" for ops in h.queued.values() for op in ops),
        "fifo_pairs": h.fifo_pairs,
    }
