"""`harel-beanie worker` with what it does under its partition leases recorded, and its
clock skewed on demand.

    python -m tests.support.netfaults.owned_worker [harel-beanie worker flags...] \\
        --record FILE [--skew SECONDS]

Why it exists. The lease collection says who owned a partition when a watcher looked; it
does not say what each worker did under its lease, nor by which clock it decided. The
partition runs (tests/reliability/test_reliability_partitions.py) start this module in
place of the real command, and check its records (`tests.support.ownership_records`):

- every look of the partition owner (`harel_beanie.transport.ownership.tick`): each lease
  held after it (taken or renewed, its epoch and its end by the worker's clock), each one
  given back above the fair share, each one the look found taken over (its renewal refused);
  and the leases given back by a clean stop;
- every claim that came back with a group (the group's partition, the epoch it was claimed
  under) and every one given back because its partition's lease ended during the claim;
- every decision of a sweep or a claim about which partitions to read (each read of
  `PartitionScope.owned`: the relay, timer and counts sweeps, the claims' filters), with
  the partitions it acts on and the ones it refuses because their lease lapsed by its clock.

Each record carries the worker's own clock (`t`) and this machine's (`true`), so records of
different processes compare on one time line while each decision stays judged by the clock
it was taken by. `--skew` moves the worker's clock (the one clock its leases, claims, timers
and sweeps read: `harel_beanie.commands.worker.settings`'s `clock`) by that many seconds.
Everything else is the real command. The hooks wrap the flows and the scope's method; they
change no call the worker makes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Generator, Optional

from pymongo.errors import PyMongoError

from harel_beanie.commands import cli
from harel_beanie.commands import worker as worker_command
from harel_beanie.core.calls import Find, UpdateOne
from harel_beanie.core.partitions import PartitionScope
from harel_beanie.transport import claiming, ownership, queues

_GIVE_BACK_LEASE = {"$set": {"until": 0.0, "owner": None}}  # ownership.tick, Rule 2c
#: the claim's give-back (claiming._heads, queues Rule 7): the lease's token cleared, the group due now
_GIVE_BACK_GROUP = {"available_at", "token"}
#: the callers whose reads of `owned()` are not decisions to act (the claim's re-check after
#: the fact is recorded by the claim's own hook)
_NOT_DECISIONS = {"_heads"}
#: what each caller of `owned()` is, as the records name it (any other: its function's name)
_LABELS = {
    "_claim_scopes": "claim filter",
    "_claim_in": "claim filter",
    "sweep": "relay sweep",
    "due_timers": "timer sweep",
    "_parts": "counts fold",
    "next_due": "idle wait",
    "next_timer": "idle wait",
}
_HERE = (__file__, os.path.join("core", "partitions.py"))


class Recorder:
    """JSON lines to one file, flushed each (a SIGKILL loses at most the line being written).
    `since` keeps when (by the worker's clock) each lease it holds began, by partition and
    epoch, so every act names the lease interval it believed it acted under."""

    def __init__(self, path: Path, worker: str, skew: float) -> None:
        self.worker, self.skew = worker, skew
        self.since: dict[tuple[int, int], float] = {}
        self._out = open(path, "a", buffering=1)
        self.write("start", skew=skew)

    def write(self, kind: str, *, t: Optional[float] = None, true: Optional[float] = None, **fields: Any) -> None:
        true = time.time() if true is None else true
        own = true + self.skew if t is None else t
        self._out.write(json.dumps({"k": kind, "w": self.worker, "t": own, "true": true, **fields}) + "\n")

    def lease(self, p: Optional[int], held: Any) -> list[Any]:
        """[partition, epoch, start, end]: the lease an act believed it held (by its clock)."""
        if held is None:
            return [p, None, None, None]
        return [p, held.epoch, self.since.get((0 if p is None else p, held.epoch)), held.until]


def _observed(flow: Generator[Any, Any, Any], before: Callable[[Any], None], after: Callable[[Any, Any], None]) -> Any:
    """`flow` unchanged, `before(call)` run before each call is handed to the driver and
    `after(call, reply)` once its reply is back (before the flow sees it)."""
    reply: Any = None
    error: Optional[BaseException] = None
    while True:
        try:
            call = flow.throw(error) if error is not None else flow.send(reply)
        except StopIteration as done:
            return done.value
        before(call)
        try:
            reply, error = (yield call), None
        except PyMongoError as exc:
            reply, error = None, exc
            continue
        after(call, reply)


def install(rec: Recorder) -> None:
    original_tick, original_release, original_claim_in = ownership.tick, ownership.release, claiming._claim_in
    original_owned = PartitionScope.owned

    def tick(st: ownership.OwnerState) -> Any:
        held_before = dict(st.held)
        given: set[int] = set()
        seen: dict[int, dict[str, Any]] = {}

        def before(call: Any) -> None:
            if isinstance(call, UpdateOne) and call.target == "partitions" and call.update == _GIVE_BACK_LEASE:
                p = call.filter["_id"]
                given.add(p)
                old = held_before.get(p)
                rec.write("drop", t=st.clock(), p=p, ep=old.epoch if old else None, why="given back")

        def after(call: Any, reply: Any) -> None:
            if isinstance(call, Find) and call.target == "partitions":
                seen.update({d["_id"]: d for d in reply if isinstance(d["_id"], int)})

        held = yield from _observed(original_tick(st), before, after)
        true = time.time()  # read before the owner publishes `held` to the scope
        now = st.clock()
        for p, h in sorted(held.items()):
            old = held_before.get(p)
            how = "renewed" if old is not None and old.epoch == h.epoch else "took"
            rec.since.setdefault((p, h.epoch), now)
            rec.write("lease", t=now, true=true, p=p, ep=h.epoch, until=h.until, how=how, owner=st.owner)
        for p, old in sorted(held_before.items()):
            if p not in given and (p not in held or held[p].epoch != old.epoch):  # taken back at once: a new epoch
                doc = seen.get(p, {})
                rec.write(
                    "drop",
                    t=now,
                    true=true,
                    p=p,
                    ep=old.epoch,
                    why="refused at renewal",
                    now_owner=doc.get("owner"),
                    now_epoch=doc.get("epoch"),
                )
        return held

    def release(st: ownership.OwnerState) -> Any:
        now = st.clock()
        for p, old in sorted(st.held.items()):
            rec.write("drop", t=now, p=p, ep=old.epoch, why="released")
        return (yield from original_release(st))

    def claim_in(st: queues.QueueState, worker_id: str, until: float, due: Any, fence: Any, *rest: Any) -> Any:
        read: dict[str, dict[str, Any]] = {}  # the groups the claim's windows returned
        found: dict[str, dict[str, Any]] = {}  # ... and those it leased, with when

        def before(call: Any) -> None:
            if _gives_back(call):
                group = call.filter.get("_id")
                info = found.get(group, {})
                p = info.get("part")
                lease = (st.scope.held or {}).get(0 if p is None else p)
                rec.write(
                    "refused",
                    t=info.get("t"),
                    true=info.get("true"),
                    what="claim",
                    parts=[rec.lease(p, lease)],
                    why="given back",
                    group=group,
                )

        def after(call: Any, reply: Any) -> None:
            if isinstance(call, Find) and call.target == "queues":
                read.update({d["_id"]: d for d in reply})
            elif isinstance(call, UpdateOne) and call.target == "queues" and reply and _leases(call):
                # the time is read before the flow's own re-check of the lease reads its clock
                true = time.time()
                group = call.filter.get("_id")
                found[group] = dict(true=true, t=st.scope.clock(), part=read.get(group, {}).get("part"))

        leases = yield from _observed(original_claim_in(st, worker_id, until, due, fence, *rest), before, after)
        for lease in leases:
            info = found.get(lease.group_id)
            if info is None:
                continue
            p = info["part"]
            held = (st.scope.held or {}).get(0 if p is None else p)
            rec.write(
                "act",
                t=info["t"],
                true=info["true"],
                what="claim",
                parts=[rec.lease(p, held)],
                group=lease.group_id,
            )
        return leases

    def owned(self: PartitionScope) -> Optional[dict[int, int]]:
        true = time.time()  # before the clock the decision reads
        result = original_owned(self)
        if result is None or self.held is None:
            return result
        caller = _caller()
        if caller in _NOT_DECISIONS:
            return result
        if result:
            rec.write("act", true=true, what=caller, parts=[rec.lease(p, self.held[p]) for p in sorted(result)])
        lapsed = [rec.lease(p, h) for p, h in sorted(self.held.items()) if p not in result]
        if lapsed:
            rec.write("refused", true=true, what=caller, parts=lapsed, why="lapsed")
        return result

    ownership.tick = tick  # type: ignore[assignment]
    ownership.release = release  # type: ignore[assignment]
    claiming._claim_in = claim_in  # type: ignore[assignment]
    PartitionScope.owned = owned  # type: ignore[method-assign]


def _gives_back(call: Any) -> bool:
    """The claim's give-back of a group whose partition's lease ended (Rule 7)."""
    update = call.update if isinstance(call, UpdateOne) and call.target == "queues" else None
    return (
        isinstance(update, dict)
        and set(update) == {"$set"}
        and set(update["$set"]) == _GIVE_BACK_GROUP
        and update["$set"]["token"] is None
    )


def _leases(call: UpdateOne) -> bool:
    """A claim's lease of a group it read (Rule 8): a token set."""
    return isinstance(call.update, dict) and call.update.get("$set", {}).get("token") is not None


def _caller() -> str:
    """The function that asked which partitions it owns: the first frame outside the scope
    and this module."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.endswith(_HERE):
        frame = frame.f_back  # type: ignore[assignment]
    name = frame.f_code.co_name if frame is not None else "?"
    return _LABELS.get(name, name)


def _flag(argv: list[str], name: str) -> Optional[str]:
    if name not in argv:
        return None
    i = argv.index(name)
    value = argv[i + 1]
    del argv[i : i + 2]
    return value


def main(argv: list[str]) -> int:
    argv = list(argv)
    record = _flag(argv, "--record")
    skew = float(_flag(argv, "--skew") or 0.0)
    worker_id = argv[argv.index("--worker-id") + 1]
    if record is None:
        raise SystemExit("--record FILE is required")
    install(Recorder(Path(record), worker_id, skew))
    settings = worker_command.settings

    def skewed(args: Any) -> dict[str, Any]:
        return {**settings(args), "clock": lambda: time.time() + skew}

    worker_command.settings = skewed  # type: ignore[assignment]
    return cli.main(["worker", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
