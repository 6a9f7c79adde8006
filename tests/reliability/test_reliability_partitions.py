"""Partition leases under process faults, with a checked history: four `harel-beanie worker`
processes on this package's transport share the partitions while a client sends events;
one is SIGKILLed, one is frozen (SIGSTOP) past its lease and thawed, and one leaves and
comes back late. A watcher reads the lease collection throughout.

What it proves, each asserted:
- every event is applied exactly once and in order per group (the history checker: the
  workers' and the client's recorded operations, the final states replayed);
- the dead worker's and the frozen worker's partitions are owned again by a live worker
  within the stated bound (`TAKEOVER_BOUND`, plus the watcher's own polling interval and
  a scheduling allowance for a loaded 2-core machine), each with its epoch bumped;
- the thawed worker holds none of the partitions it lost under its old epoch;
- when the run ends every partition has an owner.

And what each worker did, from its own records (`tests.support.netfaults.owned_worker`:
every look at the leases, every claim and every sweep's choice of partitions, each with its
epoch, the worker's clock and this machine's), judged by `tests.support.ownership_records`:
- no two workers held a valid lease on one partition at once by their own clocks (their
  fenced intervals never intersect), and every claim and sweep acted inside its own worker's
  fenced interval and outside every other's, with one worker's clock skewed within `MARGIN`
  (`SKEW_WITHIN`), which must change nothing;
- the thawed worker's look refused every lease it lost, under the epoch it lost it with, and
  it acted on none of them afterwards;
- a worker whose clock is ahead beyond `MARGIN` (`SKEW_BEYOND`) takes leases their owner
  still holds by its own clock: the records show the two owners at once (what
  docs/production-stack.md's clock requirement is for), while every event is still applied
  exactly once (each group's own lease token and the store's dedupe do not read the clock
  of another process).
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any, Optional

import pymongo
import pytest

from harel_beanie.core.names import partition_collection
from harel_beanie.core.partitions import DEFAULT_PARTITIONS
from harel_beanie.transport.ownership import LEASE_SECONDS, MARGIN, RENEW_EVERY, TAKEOVER_BOUND
from tests.support.netfaults.run import DB, PREFIX, Run, Scenario, url_of
from tests.support.ownership_records import (
    acts,
    fenced,
    overlaps,
    read_records,
    refused,
    skews,
    stray,
    successions,
    summary,
)

#: what the watcher's view may lag behind the leases (it reads every WATCH seconds) and what a
#: loaded machine may delay a survivor's look by
WATCH = 0.25
ALLOWANCE = 5.0

KILL_AT, FREEZE_AT, LEAVE_AT, BACK_AT = 3.0, 5.0, 1.0, 12.0
FREEZE_FOR = LEASE_SECONDS + RENEW_EVERY + 2.0  # past its lease, and past the others' next look
#: a run that has not ended by then fails rather than holding the suite (it takes about a minute)
RUN_LIMIT = 480.0

#: the worker command whose partition ownership is recorded (and whose clock may be skewed)
RECORDING = ("tests.support.netfaults.owned_worker",)
#: a clock ahead of the others within MARGIN: Rule 3 must hold
SKEW_WITHIN = 0.75 * MARGIN
#: a clock ahead of the others by more than a whole lease: it sees every lease but its own
#: lapsed, and its first look takes every partition from their live owners
SKEW_BEYOND = LEASE_SECONDS + 1.0

PARTITIONS = Scenario(
    "partitions", faults=(), kills=0, workers=4, executions=8, seconds=28, echo_share=0.1, worker=RECORDING
)


class RecordedRun(Run):
    """A run of recording workers (`owned_worker`): their records in `tmp/ownership`, one file
    per incarnation, each clock skewed by `skews` (by incarnation name, else by host)."""

    def __init__(self, *args: Any, skews: Optional[dict[str, float]] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skews = skews or {}
        self.ownership = self.tmp / "ownership"
        self.ownership.mkdir(parents=True, exist_ok=True)
        self.events: dict[str, float] = {}
        self.true_at: dict[str, float] = {}  # this machine's clock at each event, as the records have it

    def worker_flags(self, host: str, name: str) -> list[str]:
        skew = self.skews.get(name, self.skews.get(host, 0.0))
        return ["--record", str(self.ownership / f"{name}.jsonl"), "--skew", str(skew)]

    def mark(self, event: str, begun: float) -> None:
        self.events[event] = time.monotonic() - begun
        self.true_at[event] = time.time()


class PartitionRun(RecordedRun):
    """The network-fault run with no network faults: its process faults are the point."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.watched: list[tuple[float, dict[int, dict[str, Any]]]] = []
        self.owners_at: dict[str, list[int]] = {}

    async def _kills(self) -> None:
        begun = time.monotonic()
        done = asyncio.Event()
        watcher = asyncio.create_task(self._watch(begun, done))

        async def at(t: float) -> None:
            await asyncio.sleep(max(0.0, begun + t - time.monotonic()))

        async def leave() -> None:
            t = time.monotonic()
            await self.workers["w4"].stop()  # leaves cleanly: its leases go back at once
            self.events["left"] = time.monotonic() - begun
            self.events["stop took"] = time.monotonic() - t

        try:
            await at(LEAVE_AT)
            # not awaited here: a slow exit must not hold back the kill and the freeze (one
            # took 27 s in a loaded suite, and the whole schedule slid past the run)
            leaving = asyncio.create_task(leave())
            await at(KILL_AT)
            self.owners_at["kill"] = self._held_by("w1-")
            await self.workers["w1"].kill()
            self.mark("kill", begun)
            await at(FREEZE_AT)
            self.owners_at["freeze"] = self._held_by("w2-")
            proc = self.workers["w2"].proc
            assert proc is not None
            proc.send_signal(signal.SIGSTOP)
            self.mark("freeze", begun)
            await at(BACK_AT)
            await leaving
            await self.workers["w4"].start()  # a worker started late
            await at(FREEZE_AT + FREEZE_FOR)
            proc.send_signal(signal.SIGCONT)
            self.mark("thaw", begun)
            await at(self.scenario.seconds - 2)
            await self.workers["w1"].start()  # back for the end, as a supervisor would
        finally:
            # the late worker's share is given back by the others and taken by it over a look
            # or two, a partition unowned in between: wait for every partition to be owned again,
            # within the bound the run proves (the assertion then reads the last watch)
            settle = time.monotonic() + TAKEOVER_BOUND + ALLOWANCE
            while time.monotonic() < settle and not self._all_owned():
                await asyncio.sleep(WATCH)
            await asyncio.sleep(2 * WATCH)
            done.set()
            await asyncio.wait_for(watcher, timeout=60)

    def _all_owned(self) -> bool:
        return (
            bool(self.watched)
            and all(d.get("owner") for p, d in self.watched[-1][1].items() if p < DEFAULT_PARTITIONS)
            and len(self.watched[-1][1]) >= DEFAULT_PARTITIONS
        )

    def _held_by(self, owner_prefix: str) -> list[int]:
        """The partitions the last watch saw leased to an owner whose id starts so."""
        if not self.watched:
            return []
        now, leases = self.watched[-1]
        return sorted(p for p, d in leases.items() if str(d.get("owner") or "").startswith(owner_prefix))

    async def _watch(self, begun: float, done: asyncio.Event) -> None:
        """Read the leases every WATCH seconds until `done` (never cancelled mid-read: a read
        cut short can leave the client's close waiting for its connection)."""
        client: Any = pymongo.AsyncMongoClient(url_of(*self.network.server_addr))
        coll = client[DB][partition_collection(PREFIX)]
        try:
            while not done.is_set():
                try:
                    docs = await coll.find({"_id": {"$type": "int"}}).to_list(None)
                except pymongo.errors.PyMongoError:
                    docs = None  # the server busy past the driver's timeout: read again
                if docs is not None:
                    self.watched.append((time.monotonic() - begun, {d["_id"]: d for d in docs}))
                try:
                    await asyncio.wait_for(done.wait(), timeout=WATCH)
                except asyncio.TimeoutError:
                    pass
        finally:
            await client.close()


def _taken_over(run: PartitionRun, event: str, lost: list[int], owner_prefix: str) -> dict[int, float]:
    """For each partition in `lost`: seconds from `event` until the watcher saw it leased to
    another owner, with a higher epoch."""
    start = run.events[event]
    before = {p: d.get("epoch", 0) for p, d in run.watched[0][1].items()}
    seen_epoch = {}
    for t, leases in run.watched:
        if t <= start:
            before = {p: d.get("epoch", 0) for p, d in leases.items()}
            continue
        for p in lost:
            d = leases.get(p, {})
            owner = str(d.get("owner") or "")
            if p not in seen_epoch and owner and not owner.startswith(owner_prefix) and d["epoch"] > before[p]:
                seen_epoch[p] = t - start
    return seen_epoch


def _ownership_kept(run: RecordedRun) -> dict[str, Any]:
    """Rule 3 held, by the workers' own records: no two fenced intervals of one partition
    intersect, and every claim and sweep acted inside its own and outside every other's.
    Returns the figures of the records."""
    records = read_records(run.ownership)
    intervals, done = fenced(records), acts(records)
    pairs = overlaps(intervals)
    assert not pairs, f"two workers held one partition at once by their own clocks:\n{summary(pairs)}"
    strays = stray(intervals, done)
    assert not strays, f"{len(strays)} act(s) outside their fence, the first: {strays[:3]}"
    claims = [a for a in done if a.what == "claim"]
    # the records are of work done: claims and sweeps on every partition, by more than one worker
    assert claims and {a.part for a in done} == set(range(DEFAULT_PARTITIONS)), sorted({a.part for a in done})
    assert len({a.worker for a in claims}) > 1, {a.worker for a in claims}
    skewed = {w for w in skews(records) if skews(records)[w]}
    after_lapse = [b for a, b in successions(intervals) if b.worker in skewed and a.ended == "clock"]
    return {
        # leases a worker with a skewed clock took after they lapsed: where its skew counts
        "skewed_takeovers": len(after_lapse),
        "fenced_intervals": len(intervals),
        "claims_recorded": len(claims),
        "sweep_decisions_recorded": len(done) - len(claims),
        "overlaps": len(pairs),
    }


def _thawed_refused(run: PartitionRun, worker: str = "w2-1") -> dict[str, Any]:
    """The thawed worker's first look refused every lease it held when it was frozen (each
    taken over meanwhile), under the epoch it held it with, and it acted on none of them
    and held none of them again under that epoch afterwards. Returns its refusals' counts."""
    records = read_records(run.ownership)
    frozen, thawed = run.true_at["freeze"], run.true_at["thaw"]
    lost = {f.part: f.epoch for f in fenced(records) if f.worker == worker and f.start <= frozen < f.end}
    assert lost, f"{worker} held nothing when it was frozen"
    at_renewal = refused(records, worker, "refused at renewal", after=thawed)
    assert {p: at_renewal.get(p) for p in lost} == lost, (lost, at_renewal)
    late = [a for a in acts(records) if a.worker == worker and a.true >= thawed and lost.get(a.part) == a.epoch]
    assert not late, f"the thawed worker acted under epochs it had lost: {late[:3]}"
    again = [r for r in records if r["w"] == worker and r["k"] == "lease" and r["true"] >= thawed]
    assert not [r for r in again if lost.get(r["p"]) == r["ep"]], again
    return {
        "thawed_refused_at_renewal": len(lost),
        # claims and sweeps that found a lost lease lapsed by the thawed worker's clock before its look
        "thawed_lapsed_refusals": len(refused(records, worker, "lapsed", after=thawed)),
    }


def test_partitions_are_taken_over_within_the_bound_and_work_is_done_once(tmp_path: Path, figures: Any) -> None:
    run = PartitionRun(PARTITIONS, tmp_path, transport="beanie", layer="loopback", skews={"w3": SKEW_WITHIN})
    outcome = asyncio.run(asyncio.wait_for(run.go(), timeout=RUN_LIMIT))
    verdict = outcome.verdict
    assert verdict is not None
    where = f"(history: {outcome.history}; logs beside it)"
    assert outcome.settled, f"the work did not drain {where}\n{verdict.summary()}"
    assert verdict.ok, f"{verdict.summary()}\n{where}\n{outcome.told()}"
    assert not outcome.count_problems(), "\n".join(outcome.count_problems())  # tests/support/exact_counts.py
    assert not outcome.exits, outcome.exits
    # what the workers did, by their own records: Rule 3 kept, the thawed worker fenced
    kept = {**_ownership_kept(run), **_thawed_refused(run)}
    # the faults acted on workers that held partitions, when the schedule says
    assert run.owners_at["kill"] and run.owners_at["freeze"], run.owners_at
    late = {e: round(run.events[e] - at, 1) for e, at in (("kill", KILL_AT), ("freeze", FREEZE_AT))}
    assert all(d <= ALLOWANCE for d in late.values()), f"the schedule slipped (s late): {late}; {run.events}"
    bound = TAKEOVER_BOUND + WATCH + ALLOWANCE
    killed = _taken_over(run, "kill", run.owners_at["kill"], "w1-")
    frozen = _taken_over(run, "freeze", run.owners_at["freeze"], "w2-")
    assert set(killed) == set(run.owners_at["kill"]), (killed, run.owners_at, run.events)
    assert set(frozen) == set(run.owners_at["freeze"]), (frozen, run.owners_at)
    worst = max([*killed.values(), *frozen.values()])
    assert worst <= bound, f"a partition waited {worst:.1f}s for a new owner (bound {bound:.1f}s)"
    # nobody takes a lease before it lapses: the frozen worker kept its partitions for a lease
    # (less the skewed worker's lead: it sees the lease lapse that much earlier)
    assert min(frozen.values()) >= LEASE_SECONDS - RENEW_EVERY - WATCH - SKEW_WITHIN, frozen
    # at the end: every partition owned by a live worker
    end, leases = run.watched[-1]
    assert sorted(p for p, d in leases.items() if d.get("owner")) == list(range(DEFAULT_PARTITIONS)), leases
    figures.set(
        events_applied=verdict.figures["events_applied"],
        anomalies=len(verdict.anomalies),
        takeover_after_kill_s=round(max(killed.values()), 1),
        takeover_after_freeze_s=round(max(frozen.values()), 1),
        bound_s=TAKEOVER_BOUND,
        partitions=DEFAULT_PARTITIONS,
        clean_stop_s=round(run.events.get("stop took", -1.0), 1),  # SIGTERM until the leaving worker exited
        skew_within_s=SKEW_WITHIN,
        **kept,
    )


@pytest.mark.parametrize("owner_prefix", ["w1-"])
def test_the_takeover_reading_can_fail(owner_prefix: str) -> None:
    """The watcher's reading flags a partition nobody took: a run whose watch never shows
    another owner yields no takeover for it."""
    run = PartitionRun.__new__(PartitionRun)
    run.events = {"kill": 1.0}
    run.watched = [(0.5, {0: {"owner": "w1-1:a", "epoch": 1}}), (20.0, {0: {"owner": "w1-1:a", "epoch": 1}})]
    assert _taken_over(run, "kill", [0], owner_prefix) == {}


def test_the_ownership_reading_can_fail() -> None:
    """The records' reading flags two owners at once and an act inside another's lease, on
    the machine's time line: b's clock runs 3 s ahead, so its lease's end by its own clock
    (8 + 3) is 8 on the machine's; a's lease, given back at 6, ends then."""

    def rec(k: str, w: str, true: float, skew: float = 0.0, **f: Any) -> dict[str, Any]:
        return {"k": k, "w": w, "true": true, "t": true + skew, **f}

    kept = [
        {"k": "start", "w": "a", "true": 0.0, "t": 0.0, "skew": 0.0},
        {"k": "start", "w": "b", "true": 0.0, "t": 3.0, "skew": 3.0},
        rec("lease", "a", 1.0, p=0, ep=1, until=9.0),
        rec("drop", "a", 6.0, p=0, ep=1, why="given back"),
        rec("lease", "b", 6.5, skew=3.0, p=0, ep=2, until=11.0),
        rec("act", "a", 5.0, what="sweep", parts=[[0, 1]]),
        rec("act", "b", 7.0, skew=3.0, what="claim", parts=[[0, 2]]),
    ]
    intervals = fenced(kept)
    assert [(f.worker, f.start, f.end, f.ended) for f in intervals] == [
        ("a", 1.0, 6.0, "given back"),
        ("b", 6.5, 8.0, "clock"),
    ]
    assert overlaps(intervals) == [] and stray(intervals, acts(kept)) == []
    # a never gives it back (its lease runs to 9): b takes it at 6.5, both act at once
    broken = [r for r in kept if r["k"] != "drop"] + [rec("act", "a", 7.5, what="claim", parts=[[0, 1]])]
    intervals = fenced(broken)
    assert [(a.worker, b.worker) for a, b in overlaps(intervals)] == [("a", "b")]
    assert sorted((a.worker, a.true, why.split("'")[0]) for a, why in stray(intervals, acts(broken))) == [
        ("a", 7.5, "inside b"),
        ("b", 7.0, "inside a"),
    ]
    # an act past the lease it believed it held, by its own clock (b's 11 is the machine's 8)
    late = [*kept, rec("act", "b", 8.2, skew=3.0, what="sweep", parts=[[0, 2, 9.5, 11.0]])]
    whys = [why for a, why in stray(fenced(late), acts(late))]
    assert whys == ["past its lease by its own clock", f"outside its own lease {fenced(late)[1]}"], whys
    refusals = [rec("drop", "a", 9.0, p=0, ep=1, why="refused at renewal")]
    assert refused(refusals, "a", "refused at renewal", after=8.0) == {0: 1}
    assert refused(refusals, "a", "refused at renewal", after=9.5) == {}


@pytest.mark.soak
@pytest.mark.parametrize("seed", [2, 3, 4, 5])
def test_partition_takeovers_soak(tmp_path: Path, seed: int, figures: Any) -> None:
    """The same run again with other draws of the client's events (seeds), longer sends."""
    scenario = Scenario(
        "partitions", faults=(), kills=0, workers=4, executions=12, seconds=40, echo_share=0.2, worker=RECORDING
    )
    skews = {"w3": SKEW_WITHIN / 2, "w4": -SKEW_WITHIN / 2}  # one ahead, one behind: SKEW_WITHIN apart
    run = PartitionRun(scenario, tmp_path, transport="beanie", layer="loopback", seed=seed, skews=skews)
    outcome = asyncio.run(asyncio.wait_for(run.go(), timeout=RUN_LIMIT))
    assert outcome.verdict is not None and outcome.settled and outcome.verdict.ok, outcome.verdict
    assert not outcome.count_problems(), "\n".join(outcome.count_problems())
    kept = {**_ownership_kept(run), **_thawed_refused(run)}
    killed = _taken_over(run, "kill", run.owners_at["kill"], "w1-")
    frozen = _taken_over(run, "freeze", run.owners_at["freeze"], "w2-")
    assert set(killed) == set(run.owners_at["kill"]) and set(frozen) == set(run.owners_at["freeze"])
    assert max([*killed.values(), *frozen.values()]) <= TAKEOVER_BOUND + WATCH + ALLOWANCE
    figures.set(seed=seed, takeover_s=round(max([*killed.values(), *frozen.values()]), 1), **kept)


BEYOND = Scenario("beyond", faults=(), kills=0, workers=2, executions=4, seconds=10, echo_share=0.1, worker=RECORDING)
RESTART_AT = 2.0


class SkewedRun(RecordedRun):
    """Two workers; at RESTART_AT the second is SIGKILLed and started again with its clock
    `SKEW_BEYOND` ahead (its first incarnation shared the partitions on a true clock, so the
    first worker holds its share when the skewed one first looks)."""

    async def _kills(self) -> None:
        begun = time.monotonic()
        await asyncio.sleep(RESTART_AT)
        await self.workers["w2"].kill()
        await self.workers["w2"].start()
        self.mark("skewed start", begun)
        await asyncio.wait_for(self.workers["w2"].ready.wait(), timeout=120)


def test_a_clock_ahead_beyond_the_margin_takes_leases_still_held(tmp_path: Path, figures: Any) -> None:
    """What breaks beyond MARGIN (docs/production-stack.md): the skewed worker's first look
    takes the partitions the other still holds by its own clock, so both act on them until
    the other's next look finds its renewal refused; no event is lost or doubled."""
    run = SkewedRun(BEYOND, tmp_path, transport="beanie", layer="loopback", skews={"w2-2": SKEW_BEYOND})
    outcome = asyncio.run(asyncio.wait_for(run.go(), timeout=RUN_LIMIT))
    verdict = outcome.verdict
    assert verdict is not None and outcome.settled, verdict
    assert verdict.ok, f"{verdict.summary()}\n{outcome.told()}"
    assert not outcome.count_problems(), "\n".join(outcome.count_problems())  # tests/support/exact_counts.py
    records = read_records(run.ownership)
    intervals = fenced(records)
    pairs = overlaps(intervals)
    first = min(f.start for f in intervals if f.worker == "w2-2")  # the end of the skewed worker's first look
    took = {f.part for f in intervals if f.worker == "w2-2" and f.start == first}
    held = {f.part for f in intervals if f.worker == "w1-1" and f.start <= first < f.end}
    # its first look took every partition the true-clocked worker held, valid by that one's clock
    assert held and held <= took, (sorted(held), sorted(took))
    taken = {a.part for a, b in pairs if {a.worker, b.worker} == {"w1-1", "w2-2"}}
    assert held <= taken, summary(pairs)  # so both held each at once
    # and the true-clocked worker's next look found each taken from it
    assert set(refused(records, "w1-1", "refused at renewal", after=first)) >= held
    both = stray(intervals, acts(records))
    figures.set(
        skew_s=SKEW_BEYOND,
        partitions_held_twice=len(taken),
        acts_inside_anothers_lease=sum(1 for _, why in both if why.startswith("inside")),
        events_applied=verdict.figures["events_applied"],
        anomalies=len(verdict.anomalies),
    )
