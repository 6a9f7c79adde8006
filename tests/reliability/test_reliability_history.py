"""The history checker (`harel_beanie.history`) judged on its own: every hand-made bad history
is flagged with exactly the anomaly it was made to show, a good one passes, and a history
recorded on the real store passes while a copy with one applied event removed does not.

The hand-made histories are built record by record (`Story`), one tick apart, on the Tally
model of `tests/support/history_models` (its context lists the ids of the events it applied in
`seen`); the final states are compared with harel's own in-memory replay of that model. The
recorded one runs the same model through harel's `AsyncWorker` on `AsyncMongoStore` and this
package's transport, with the worker's store wrapped in a `RecordingStore`, and is judged
again by `harel-beanie check-history` in a child process.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from harel.engine.aio_store.dict import AsyncDictStore
from harel.engine.execution import Execution
from harel.engine.store import ExecutionAlreadyExists, StoreConflict
from harel.spec.states import Event

from harel_beanie import Anomaly, HistoryWriter, RecordingStore, Verdict, check
from harel_beanie.core.names import queue_names
from harel_beanie.deploy.loader import load_models
from harel_beanie.harness.drivers import AsyncWorkerDriver, ManualClock, open_mongo_transport
from harel_beanie.history import RecordingTransport, pair, read_history, stories
from harel_beanie.history import story as event_story
from harel_beanie.history.replay import replay
from tests.commands.test_cli import run_cli

MODELS = Path(__file__).resolve().parents[1] / "support" / "history_models"
START = {"seen": [], "echoes": 0, "nudge": 0.3}  # Tally's context as harel creates it


@pytest.fixture(scope="module")
def definitions() -> dict[str, Any]:
    return load_models(MODELS)


def judge(records: list[dict[str, Any]], definitions: Optional[dict[str, Any]] = None) -> Verdict:
    return check(records, None if definitions is None else (lambda case: replay(case, definitions)))


def kinds(verdict: Verdict) -> set[str]:
    return {a.kind for a in verdict.anomalies}


# --- hand-made histories ------------------------------------------------------------------


class Story:
    """A history written by hand: each operation is an invoke and, unless `incomplete`, its
    completion, one tick apart; each process numbers its own operations."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.t = 0
        self.next: Counter[str] = Counter()

    def _record(self, p: str, i: int, type: str, f: str, fields: dict[str, Any]) -> None:
        self.t += 1
        self.records.append({"t": self.t, "p": p, "i": i, "type": type, "f": f, **fields})

    def op(self, p: str, f: str, outcome: str, invoke: dict[str, Any], done: Optional[dict[str, Any]] = None) -> None:
        i = self.next[p]
        self.next[p] += 1
        self._record(p, i, "invoke", f, invoke)
        if outcome != "incomplete":
            self._record(p, i, outcome, f, done if done is not None else {})

    def create(self, exe: str, outcome: str = "ok", p: str = "worker") -> None:
        done = {"version": 1} if outcome == "ok" else {"error": "refused or lost"}
        self.op(p, "create", outcome, {"exe": exe, "definition": "Tally", "context": START, "parent": None}, done)

    def commit(
        self,
        exe: str,
        start: int,
        outcome: str = "ok",
        *,
        to: Optional[int] = None,
        event: Optional[str] = None,
        p: str = "worker",
    ) -> None:
        done = {"to": start + 1 if to is None else to} if outcome == "ok" else {"error": "lost", "found": None}
        self.op(p, "commit", outcome, {"exe": exe, "from": start, "to": start + 1, "event": event}, done)

    def read(self, exe: str, version: Optional[int], p: str = "reader") -> None:
        self.op(p, "read", "ok", {"exe": exe}, {"version": version})

    def send(self, exe: str, eid: str, outcome: str = "ok", kind: str = "Bump", p: str = "client") -> None:
        self.op(p, "send", outcome, {"exe": exe, "event": eid, "kind": kind, "data": {}}, {"error": "lost"})

    def publish(self, group: str, eid: str, outcome: str = "ok", p: str = "client") -> None:
        self.op(p, "publish", outcome, {"group": group, "event": eid, "kind": "Bump"}, {"error": "lost"})

    def deliver(self, group: str, eid: str, outcome: str = "ok", p: str = "worker") -> None:
        self.op(p, "deliver", outcome, {"group": group, "event": eid, "kind": "Bump"})

    def final(self, exe: str, version: int, seen: list[str], **overrides: Any) -> None:
        rec = {
            "exe": exe,
            "definition": "Tally",
            "parent": None,
            "version": version,
            "status": "RUNNING",
            "active_path": "Settled",
            "context": {**START, "seen": seen},
            "deferred": 0,
            **overrides,
        }
        self._record("observer", self.next["observer"], "ok", "final", rec)
        self.next["observer"] += 1

    def drain(self, **left: int) -> None:
        counts = {"outbox": 0, "spawns": 0, "timers": 0, "queued": 0, "leased": 0, **left}
        self._record("observer", self.next["observer"], "ok", "drain", counts)
        self.next["observer"] += 1

    def run(self, exe: str = "t1", events: tuple[str, ...] = ("b1",)) -> int:
        """A good life: created, started, settled, then each event sent and applied (two
        commits each: the event, its timer). Returns the last version."""
        self.create(exe)
        self.commit(exe, 1)  # the Start
        self.commit(exe, 2)  # Fresh's timeout: Settled
        v = 3
        for eid in events:
            self.send(exe, eid)
            self.read(exe, v, p="worker")
            self.commit(exe, v, event=eid)
            self.commit(exe, v + 1)
            v += 2
        return v


def story(build: Callable[[Story], None]) -> list[dict[str, Any]]:
    s = Story()
    build(s)
    return s.records


def good(s: Story) -> None:
    v = s.run(events=("b1", "b2"))
    s.read("t1", v)
    s.final("t1", v, ["b1", "b2"])
    s.drain()


def lost(s: Story) -> None:
    v = s.run()
    s.send("t1", "b2")  # acknowledged, never applied
    s.final("t1", v, ["b1"])
    s.drain()


def doubled(s: Story) -> None:
    v = s.run()
    s.final("t1", v, ["b1", "b1"])
    s.drain()


def never_sent(s: Story) -> None:
    v = s.run()
    s.final("t1", v, ["b1", "zz"])
    s.drain()


def every_send_failed(s: Story) -> None:
    v = s.run()
    s.send("t1", "b2", "fail")
    s.send("t1", "b2", "fail")
    s.final("t1", v, ["b1", "b2"])
    s.drain()


def uncertain_send(outcome: str, applied: int) -> Callable[[Story], None]:
    def build(s: Story) -> None:
        v = s.run()
        s.send("t1", "b2", outcome)
        s.final("t1", v, ["b1"] + ["b2"] * applied)
        s.drain()

    build.__name__ = f"{outcome}_send_applied_{applied}"
    return build


def skipped_version(s: Story) -> None:
    v = s.run()
    s.commit("t1", v, "unknown", p="other")  # claims v + 1, which the next says it skipped
    s.commit("t1", v, to=v + 2)
    s.final("t1", v + 2, ["b1"])
    s.drain()


def same_version(s: Story) -> None:
    v = s.run()
    s.commit("t1", v)
    s.commit("t1", v, p="other")
    s.final("t1", v + 1, ["b1"])
    s.drain()


def lost_ack(s: Story) -> None:
    v = s.run()
    s.commit("t1", v)  # acknowledged, then gone: the execution ends a version below it
    s.final("t1", v, ["b1"])
    s.drain()


def unaccounted_version(s: Story) -> None:
    v = s.run()
    s.final("t1", v + 1, ["b1"])  # a version no recorded write could have stored
    s.drain()


def stale_read(s: Story) -> None:
    v = s.run()
    s.read("t1", v - 1)
    s.final("t1", v, ["b1"])
    s.drain()


def null_read_after_create(s: Story) -> None:
    s.create("t1")
    s.read("t1", None)
    s.commit("t1", 1)
    s.commit("t1", 2)
    s.final("t1", 3, [])
    s.drain()


def replay_mismatch(s: Story) -> None:
    v = s.run()
    s.final("t1", v, ["b1"], active_path="Fresh", context={**START, "seen": ["b1"], "echoes": 1})


def not_drained(s: Story) -> None:
    v = s.run()
    s.final("t1", v, ["b1"])
    s.drain(outbox=1, leased=1)


def deferred_left(s: Story) -> None:
    v = s.run()
    s.final("t1", v, ["b1"], deferred=2)
    s.drain()


def missing_final(s: Story) -> None:
    v = s.run()
    s.run("t2", events=("c1",))
    s.final("t1", v, ["b1"])
    s.drain()


def missing_drain(s: Story) -> None:
    v = s.run()
    s.final("t1", v, ["b1"])


def queued(s: Story, published: tuple[str, ...], delivered: tuple[str, ...]) -> None:
    """Events sent and published one after the other (each publish acknowledged before the
    next began), then delivered and applied in the order `delivered`."""
    s.create("t1")
    s.commit("t1", 1)
    s.commit("t1", 2)
    for eid in published:
        s.send("t1", eid)
        s.publish("t1", eid)
    v = 3
    for eid in delivered:
        s.deliver("t1", eid)
        s.read("t1", v, p="worker")
        s.commit("t1", v, event=eid)
        s.commit("t1", v + 1)
        v += 2
    s.final("t1", v, list(delivered))
    s.drain()


def reordered(s: Story) -> None:
    """FIFO broken: b2, published after b1's publish was acknowledged, delivered and applied
    first (as a transport that let a later message overtake would)."""
    queued(s, ("b1", "b2", "b3"), ("b2", "b1", "b3"))


def in_order(s: Story) -> None:
    queued(s, ("b1", "b2", "b3"), ("b1", "b2", "b3"))


def overlapping_publishes(s: Story) -> None:
    """Two publishes in flight at once have no order to keep: delivered either way round."""
    s.create("t1")
    s.commit("t1", 1)
    s.commit("t1", 2)
    s.send("t1", "b1")
    s.send("t1", "b2")
    for eid in ("b1", "b2"):
        s._record("client", 100 + int(eid[1]), "invoke", "publish", {"group": "t1", "event": eid, "kind": "Bump"})
    for eid in ("b1", "b2"):
        s._record("client", 100 + int(eid[1]), "ok", "publish", {})
    v = 3
    for eid in ("b2", "b1"):
        s.deliver("t1", eid)
        s.commit("t1", v, event=eid)
        s.commit("t1", v + 1)
        v += 2
    s.final("t1", v, ["b2", "b1"])
    s.drain()


def replay_mismatch_too(s: Story) -> None:
    replay_mismatch(s)
    s.drain()


BAD = [
    (lost, "lost"),
    (doubled, "doubled"),
    (never_sent, "phantom"),
    (every_send_failed, "phantom"),
    (uncertain_send("unknown", 2), "doubled"),
    (uncertain_send("incomplete", 2), "doubled"),
    (skipped_version, "skipped-version"),
    (same_version, "same-version"),
    (lost_ack, "lost-ack"),
    (unaccounted_version, "unaccounted-version"),
    (stale_read, "stale-read"),
    (null_read_after_create, "stale-read"),
    (replay_mismatch_too, "replay-mismatch"),
    (not_drained, "not-drained"),
    (deferred_left, "not-drained"),
    (missing_final, "no-final"),
    (missing_drain, "no-final"),
    (reordered, "reordered"),
]


@pytest.mark.parametrize(("build", "kind"), BAD, ids=[b.__name__ for b, _ in BAD])
def test_each_bad_history_is_flagged_with_its_anomaly(
    build: Callable[[Story], None], kind: str, definitions: Any
) -> None:
    verdict = judge(story(build), definitions)
    assert kinds(verdict) == {kind}, [str(a) for a in verdict.anomalies]
    assert all(a.exe == ("t2" if build is missing_final else "t1") for a in verdict.anomalies if a.exe is not None)
    assert not verdict.ok and kind in verdict.summary()


GOOD = [
    good,
    uncertain_send("unknown", 0),
    uncertain_send("unknown", 1),
    uncertain_send("incomplete", 1),
    in_order,
    overlapping_publishes,
]


@pytest.mark.parametrize("build", GOOD, ids=[b.__name__ for b in GOOD])
def test_good_histories_pass(build: Callable[[Story], None], definitions: Any) -> None:
    verdict = judge(story(build), definitions)
    assert verdict.ok, [str(a) for a in verdict.anomalies]
    assert verdict.figures["replayed"] == 1 and verdict.summary().startswith("ok: no anomaly")


def test_an_incomplete_write_may_have_landed() -> None:
    """A create and a commit whose processes died before their completion: each counts as
    unknown, so the versions they aimed at are accounted for."""
    s = Story()
    s.create("t1", "incomplete", p="killed")
    s.commit("t1", 1, p="worker")
    s.commit("t1", 2, "incomplete", p="killed-too")
    s.final("t1", 3, [])
    s.drain()
    verdict = judge(s.records)
    assert verdict.ok, [str(a) for a in verdict.anomalies]
    assert verdict.figures["incomplete"] == 2 and verdict.figures["operations"]["create"] == {"incomplete": 1}


def test_a_reordered_group_is_named_with_the_events_that_overtook(definitions: Any) -> None:
    """The FIFO rule names the event delivered (and applied) too early and the one it
    overtook; the events that kept their order are not named."""
    verdict = judge(story(reordered), definitions)
    assert [a.detail.split(" was ")[1].split(",")[0] for a in verdict.anomalies] == [
        "delivered before 'b1'",
        "applied before 'b1'",
    ], [str(a) for a in verdict.anomalies]
    assert all(a.detail.startswith("event 'b2'") for a in verdict.anomalies)
    # b1 before b2 and b3, b2 before b3: three ordered pairs, each compared
    assert verdict.figures["fifo_pairs"] == 3 and verdict.figures["deliveries"] == 3


def test_the_replay_comparison_names_what_differs(definitions: Any) -> None:
    verdict = judge(story(replay_mismatch_too), definitions)
    (anomaly,) = verdict.anomalies
    assert "active_path: history 'Fresh', replay 'Settled'" in anomaly.detail
    assert "context.echoes: history 1, replay 0" in anomaly.detail
    assert "seen" not in anomaly.detail  # what agrees is not listed


def test_without_a_replay_final_states_are_not_compared() -> None:
    verdict = judge(story(replay_mismatch_too))
    assert verdict.ok and verdict.figures["replayed"] == 0


def test_a_restarted_process_reusing_its_name_leaves_its_open_invoke_incomplete() -> None:
    records = [
        {"t": 1, "p": "w", "i": 0, "type": "invoke", "f": "read", "exe": "t1"},  # then SIGKILLed
        {"t": 2, "p": "w", "i": 0, "type": "invoke", "f": "read", "exe": "t1"},  # the new process
        {"t": 3, "p": "w", "i": 0, "type": "ok", "f": "read", "version": 1},
        {"t": 4, "p": "x", "i": 7, "type": "ok", "f": "read", "version": 1},  # no invoke: a stray
    ]
    paired = pair(records)
    assert [op.outcome for op in paired.operations] == ["incomplete", "ok"]
    assert len(paired.strays) == 1 and paired.operations[1].completion == records[2]


def test_anomalies_read_as_one_line() -> None:
    assert str(Anomaly("lost", "t1", "event 'b2' ...")) == "lost t1: event 'b2' ..."
    assert str(Anomaly("not-drained", None, "outbox 1")) == "not-drained (run): outbox 1"


# --- writing and reading ------------------------------------------------------------------


def test_writers_append_whole_lines_that_read_back_in_time_order(tmp_path: Path) -> None:
    a = HistoryWriter(tmp_path / "a.jsonl", "client")
    b = HistoryWriter(tmp_path / "b.jsonl", "worker")
    i = a.invoke("send", exe="t1", event="b1", kind="Bump", data={})
    j = b.invoke("read", exe="t1")
    b.complete(j, "ok", version=None)
    a.complete(i, "unknown", error="timed out")
    b.info("fault", kind="partition", target="w1")
    b.write({"f": "drain", "type": "ok", "outbox": 0})
    with pytest.raises(ValueError, match="no invoke 5"):
        a.complete(5, "ok")
    with pytest.raises(ValueError, match="type must be"):
        a.complete(a.invoke("read", exe="t1"), "maybe")
    a.close()
    b.close()
    records = read_history([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    assert [(r["p"], r["i"], r["type"], r["f"]) for r in records] == [
        ("client", 0, "invoke", "send"),
        ("worker", 0, "invoke", "read"),
        ("worker", 0, "ok", "read"),
        ("client", 0, "unknown", "send"),
        ("worker", 1, "info", "fault"),
        ("worker", 2, "ok", "drain"),
        ("client", 1, "invoke", "read"),
    ]
    assert records == sorted(records, key=lambda r: r["t"])


def test_a_torn_last_line_is_skipped_and_any_other_bad_line_named(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path, "w") as w:
        w.invoke("read", exe="t1")
    path.write_text(path.read_text() + '{"t": 9, "p": "w", "i": 1, "ty')  # cut mid-line
    assert len(read_history([path])) == 1
    path.write_text('{"t": 1}\n' + path.read_text())
    with pytest.raises(ValueError, match=r"h\.jsonl:1: a record needs"):
        read_history([path])


# --- the recording store ------------------------------------------------------------------


class Refusing:
    """A store whose commits fail as told."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def commit(self, exe: Execution, emits: Any, processed_event_id: Optional[str] = None, **kw: Any) -> Any:
        raise self.error


async def test_the_recording_store_records_what_it_was_asked_and_told(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    writer = HistoryWriter(path, "w")
    inner = AsyncDictStore()
    store = RecordingStore(inner, writer)
    exe = Execution(id="t1", definition_id="Tally", context={"seen": []})
    await store.commit(exe, [("t1", Event(kind="Start"))])
    exe.context["seen"] = ["b1"]
    await store.commit(exe, [], "b1")
    await store.save(exe)
    assert (await store.load("t1")) is exe and await store.load("nope") is None
    assert not hasattr(store, "load_for_event")  # harel's dict store has none: neither has its wrapper
    assert store.pending_outbox == inner.pending_outbox  # unrecorded: handed through
    for error in [StoreConflict("t1", 3, 4), TimeoutError("no reply"), ExecutionAlreadyExists("t1")]:
        with pytest.raises(type(error)):  # recorded, and raised as it was
            await RecordingStore(Refusing(error), writer).commit(exe, [], "b2")
    writer.close()
    got = [{k: v for k, v in r.items() if k not in ("t", "p")} for r in read_history([path])]
    assert got == [
        {
            "i": 0,
            "type": "invoke",
            "f": "create",
            "exe": "t1",
            "definition": "Tally",
            "context": {"seen": []},
            "parent": None,
        },
        {"i": 0, "type": "ok", "f": "create", "version": 1},
        {"i": 1, "type": "invoke", "f": "commit", "exe": "t1", "event": "b1", "from": 1, "to": 2},
        {"i": 1, "type": "ok", "f": "commit", "to": 2},
        {"i": 2, "type": "invoke", "f": "commit", "exe": "t1", "event": None, "from": 2, "to": 3},
        {"i": 2, "type": "ok", "f": "commit", "to": 3},
        {"i": 3, "type": "invoke", "f": "read", "exe": "t1"},
        {"i": 3, "type": "ok", "f": "read", "version": 3},
        {"i": 4, "type": "invoke", "f": "read", "exe": "nope"},
        {"i": 4, "type": "ok", "f": "read", "version": None},
        {"i": 5, "type": "invoke", "f": "commit", "exe": "t1", "event": "b2", "from": 3, "to": 4},
        {
            "i": 5,
            "type": "fail",
            "f": "commit",
            "error": "StoreConflict: stale write to t1: expected version 3, found 4",
            "found": 4,
        },
        {"i": 6, "type": "invoke", "f": "commit", "exe": "t1", "event": "b2", "from": 3, "to": 4},
        {"i": 6, "type": "unknown", "f": "commit", "error": "TimeoutError: no reply"},
        {"i": 7, "type": "invoke", "f": "commit", "exe": "t1", "event": "b2", "from": 3, "to": 4},
        {"i": 7, "type": "fail", "f": "commit", "error": "ExecutionAlreadyExists: execution 't1' already exists"},
    ]


# --- a history recorded on the real store -------------------------------------------------


async def record_a_run(
    astore: Any, client: Any, mongo_url: str, db_name: str, folder: Path, definitions: Any
) -> Counter[str]:
    """Four Tallies through harel's AsyncWorker on the store and this package's transport:
    events sent in bursts (an Echo's Ping defers what follows it), one event sent twice, the
    clock run until every timer fired; then the final records. Returns the events sent, by kind."""
    worker_log = HistoryWriter(folder / "worker.jsonl", "worker")
    client_log = HistoryWriter(folder / "client.jsonl", "client")
    clock = ManualClock()
    # the client's publishes and the worker's deliveries go through one transport here
    transport = RecordingTransport(
        await open_mongo_transport(mongo_url, db_name, clock=clock, kind="beanie", idle_wait=0.0), worker_log
    )
    driver = AsyncWorkerDriver(RecordingStore(astore, worker_log), transport, definitions, clock)
    exes = [f"tally-{k}" for k in range(4)]
    sent: Counter[str] = Counter()

    async def send(exe: str, eid: str, kind: str) -> None:
        i = client_log.invoke("send", exe=exe, event=eid, kind=kind, data={})
        await driver.sender.send(exe, Event(id=eid, kind=kind))
        client_log.complete(i, "ok")

    try:
        for exe in exes:
            await driver.create("Tally", exe, {})
        for burst in range(3):
            for k, exe in enumerate(exes):
                for j, kind in enumerate(("Echo", "Bump", "Bump") if (burst + k) % 2 else ("Bump", "Echo", "Echo")):
                    await send(exe, f"{exe}:{burst}:{j}", kind)
                    sent[kind] += 1
            await driver.drain()
            await driver.timers(3600)
        await send(exes[0], f"{exes[0]}:0:1", "Bump")  # again: a client unsure it went out
        await driver.drain()
        await driver.timers(3600)
    finally:
        await transport.close()
    for exe_id in sorted(await astore.ids_with_prefix("tally-")):
        exe = await astore.load(exe_id)
        client_log.write(
            {
                "f": "final",
                "type": "ok",
                "exe": exe.id,
                "definition": exe.definition_id,
                "parent": exe.parent_id,
                "version": exe.version,
                "status": exe.status.value,
                "active_path": exe.active_path,
                "context": exe.context,
                "deferred": len(exe.deferred),
            }
        )
    queues = client[db_name][queue_names("harel")[0]]
    waiting = list(queues.aggregate([{"$group": {"_id": None, "n": {"$sum": "$pending"}}}]))
    client_log.write(
        {
            "f": "drain",
            "type": "ok",
            "outbox": len(await astore.pending_outbox()),
            "spawns": len(await astore.pending_spawns()),
            "timers": len(await astore.due_timers(clock() + 10 * 365 * 86400)),
            "queued": waiting[0]["n"] if waiting else 0,
            "leased": queues.count_documents({"token": {"$ne": None}, "pending": {"$gt": 0}}),
        }
    )
    worker_log.close()
    client_log.close()
    return sent


async def test_a_history_recorded_on_the_store_passes_and_one_lost_event_is_flagged(
    astore: Any, client: Any, mongo_url: str, db_name: str, tmp_path: Path, definitions: Any
) -> None:
    sent = await record_a_run(astore, client, mongo_url, db_name, tmp_path, definitions)
    files = [tmp_path / "client.jsonl", tmp_path / "worker.jsonl"]
    records = read_history(files)
    verdict = judge(records, definitions)
    assert verdict.ok, [str(a) for a in verdict.anomalies]
    f = verdict.figures
    assert f["events_sent"] == f["events_applied"] == sent.total() and f["replayed"] == 4
    assert f["operations"]["create"] == {"ok": 4 + sent["Echo"]}  # the Tallies and one Ping per Echo
    # with no fault, every version of every execution is one acknowledged write
    versions = sum(r["version"] for r in records if r["f"] == "final")
    assert f["operations"]["create"]["ok"] + f["operations"]["commit"]["ok"] == versions
    assert f["operations"]["read"]["ok"] > sent.total()  # at least the worker's read of each event
    assert f["executions"] == 4 + sent["Echo"] and f["unknown"] == f["incomplete"] == 0
    # every event was published and delivered through the recorded transport, in order
    assert f["fifo_pairs"] > sent.total() and f["deliveries"] >= f["publishes"] > sent.total()

    corrupt = copy.deepcopy(records)
    final = next(r for r in corrupt if r["f"] == "final" and r["exe"] == "tally-1")
    dropped = next(eid for eid in final["context"]["seen"] if eid.endswith(":1"))  # a Bump
    final["context"]["seen"].remove(dropped)
    bad = judge(corrupt, definitions)
    assert [(a.kind, a.exe) for a in bad.anomalies] == [("lost", "tally-1")] and repr(dropped) in bad.anomalies[
        0
    ].detail

    (tmp_path / "corrupt.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corrupt))
    ok = run_cli("check-history", *map(str, files), "--definitions", str(MODELS), cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok: no anomaly" in ok.stdout and "final states replayed 4" in ok.stdout
    flagged = run_cli("check-history", "corrupt.jsonl", "--definitions", str(MODELS), "--json", cwd=tmp_path)
    assert flagged.returncode == 1, flagged.stdout + flagged.stderr
    out = json.loads(flagged.stdout)
    assert not out["ok"] and [a["kind"] for a in out["anomalies"]] == ["lost"] and out["records"] == len(records)
    # the lost event's story: its send, publish and delivery, each invoked and acknowledged,
    # in time order, and the final record of its execution
    told = event_story(corrupt, dropped)
    kinds = [line.split()[2:4] for line in told]
    for f in ("send", "publish", "deliver"):
        assert [f, "invoke"] in kinds and [f, "ok"] in kinds, told
    assert kinds[-1] == ["final", "ok"] and "exe=tally-1" in told[-1], told
    seconds = [float(line.split()[0].rstrip("s")) for line in told]
    assert seconds == sorted(seconds), told
    assert stories(corrupt, bad).startswith(f"the story of event {dropped!r}")
    with_story = run_cli(
        "check-history", "corrupt.jsonl", "--definitions", str(MODELS), "--story", dropped, cwd=tmp_path
    )
    assert with_story.returncode == 1 and "\n  ".join(told) in with_story.stdout, with_story.stdout


def test_the_command_refuses_what_it_cannot_read_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text("not json\n{}\n")
    for args, says in [
        (["missing.jsonl"], "cannot read the history"),
        (["bad.jsonl"], "bad.jsonl:1: not a JSON record"),
    ]:
        proc = run_cli("check-history", *args, "--definitions", str(MODELS), cwd=tmp_path)
        assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    proc = run_cli("check-history", "bad.jsonl", "--definitions", "nowhere", cwd=tmp_path)
    assert proc.returncode == 2 and "no definitions directory" in proc.stderr, proc.stderr
