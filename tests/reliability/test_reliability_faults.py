"""Server faults: every store operation, failed at every step, ends in the state a run with
no fault ends in, with nothing doubled or lost.

A scenario drives one execution through everything a worker does with a store: the store's
set-up, the creation of the execution (with an emit, a spawn and a timer), four event
deliveries (one a duplicate) each committing emits, spawns, timers, a processed id and a
trace step, the outbox and spawn relays acking, the timer sweep deleting what is due, and
a purge. Its caller behaves as harel's engine does after a failure: it retries the operation
(an event is redelivered, and deduped by its id), reloads on `StoreConflict`, and takes a
creation that conflicts with itself as done. The only errors it may see are PyMongo errors
and `StoreConflict`: anything else fails the test.

The faults:

- failCommand fail points on the real server (`--enable-test-commands`), scoped by appName
  to the store's own client, at every k-th command of the scenario: the connection closed
  before the command runs, a ShutdownInProgress or MaxTimeMSExpired error (outcome unknown
  to the driver), a plain command error, and a writeConcernError, which the server returns
  *after* applying the write (Temporal's "execute and timeout": applied while the caller
  sees an error);
- a command blocked on the server longer than the client's socket timeout, so the client
  gives up and the server applies the write afterwards;
- the store's own calls wrapped, deterministically, for each write kind: applied then the
  reply lost, dropped before it ran, and applied late (after the store's next call).

After each run the documents must equal the fault-free run's, compared field by field with
only the commit token and the seq values (random and time-based by design) left out. Every
run also checks, in the client's command log, that its fault fired on the very command it
meant (the collection included), and that a command the server held has run before it looks.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter
from typing import Any, Callable, Iterator, Optional

import pymongo
import pytest
from harel.engine.execution import Execution
from harel.engine.store.base import StoreConflict, TimerOp
from harel.spec.states import Event
from pymongo.errors import AutoReconnect, OperationFailure, PyMongoError

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.core import calls
from harel_beanie.core.documents import SCHEMA_MARKER_ID, SCHEMA_VERSION
from harel_beanie.deploy.embedded import EmbeddedServer
from tests.support.both import BlockingAsyncStore
from tests.support.wire import Hit, Recorder

VICTIM = "hb-victim"  # the appName every fault is scoped to
X, PEER = "x.exe", "peer"
STORE_COMMANDS = {"createIndexes", "find", "insert", "update", "delete", "findAndModify"}


# --- the server, the command log ------------------------------------------------------------


@pytest.fixture(scope="module")
def fault_url() -> Iterator[str]:
    """A server of our own with failCommand enabled: fail points are server-wide, so they
    never touch the session's shared server."""
    with EmbeddedServer(test_commands=True) as server:
        yield server.url


@pytest.fixture(scope="module")
def admin(fault_url: str) -> Iterator[pymongo.MongoClient[Any]]:
    c: pymongo.MongoClient[Any] = pymongo.MongoClient(fault_url)
    yield c
    c.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
    c.close()


# --- the scenario and its caller ------------------------------------------------------------


class Caller:
    """harel's side of a failure: retry the operation; tally what was seen."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.seen: Counter[str] = Counter()

    def retry(self, op: Callable[[], Any], attempts: int = 25) -> Any:
        for _ in range(attempts):
            try:
                return op()
            except PyMongoError as err:
                self.seen[type(err).__name__] += 1
        raise AssertionError(f"no recovery after {attempts} attempts: {self.seen}")

    def create(self, exe: Execution, **commit: Any) -> None:
        def attempt() -> None:
            try:
                self.store.commit(exe.model_copy(deep=True), **commit)
            except StoreConflict as err:
                # a creation that an earlier attempt already made (its reply was lost)
                self.seen["StoreConflict"] += 1
                assert err.expected == 0 and err.found == 1, err

        self.retry(attempt)

    def deliver(self, exe_id: str, ev: Event, effects: Callable[[Execution, Event], dict[str, Any]]) -> str:
        """Handle `ev` exactly once: load with the dedupe answer, skip it if it was already
        processed, else advance and commit; reload on a conflict, redeliver on an error."""

        def attempt() -> str:
            while True:
                exe, seen = self.store.load_for_event(exe_id, ev.id)
                assert exe is not None
                if seen:
                    return "duplicate"
                args = effects(exe, ev)
                try:
                    self.store.commit(exe, **args)
                    return "handled"
                except StoreConflict:
                    self.seen["StoreConflict"] += 1

        result: str = self.retry(attempt)
        return result


def effects(exe: Execution, ev: Event) -> dict[str, Any]:
    n = ev.data["n"]
    exe.context["log"] = exe.context.get("log", []) + [ev.id]
    timers = [TimerOp("schedule", f"After.{ev.id}", 20.0 + n)]
    if n == 2:
        timers.append(TimerOp("cancel", "Wait"))
    if n == 3:
        timers.append(TimerOp("schedule", "Later", 500.0))
    return dict(
        emits=[(PEER, Event(id="out-" + ev.id, kind="Out", data={"ev": ev.id, "$op": {"a.b": n}}))],
        processed_event_id=ev.id,
        timers=tuple(timers),
        spawns=((f"{exe.id}:{ev.id}", "Fork.B", {"ev": ev.id}),),
        trace={"ev": ev.id},
    )


EVENTS = [Event(id=f"e{n}", kind="Go", data={"n": n}) for n in (1, 2, 3)]


def setup_peer(coll: Any) -> None:
    """The peer execution, written directly (no fault reaches it): it holds outbox entries
    addressed to X, which X's purge must remove, and one addressed elsewhere, which stays."""
    peer = Execution(id=PEER, definition_id="d")
    # the layout marker first, else the store would take the database for harel's own layout
    coll.database["harel_counters"].insert_one({"_id": SCHEMA_MARKER_ID, "n": SCHEMA_VERSION})
    coll.insert_one(
        {
            "_id": PEER,
            "definition_id": "d",
            "version": 1,
            "data": peer.model_copy(update={"version": 1}).model_dump_json(),
            "status": "PENDING",
            "pending": True,  # layout 2: a document holding entries is flagged (documents.PENDING)
            "outbox": [
                {"seq": 11, "target_id": X, "event": Event(id="to-x", kind="ToX").model_dump_json()},
                {"seq": 12, "target_id": "elsewhere", "event": Event(id="keep", kind="Keep").model_dump_json()},
            ],
            "spawns": [],
            "processed": [],
            "timers": {},
            "trace": [],
            "trace_n": 0,
        }
    )


def snapshot(coll: Any) -> dict[str, Any]:
    """The stored documents, with the commit token and seq values left out (both random or
    time-based by design); seqs are checked unique and increasing instead."""
    out = {}
    for doc in coll.find({}):
        doc = dict(doc)
        if "tomb" in doc:  # a purged execution: that it is buried, and how many times
            out[doc["_id"]] = {"tomb": len(doc["tomb"]["buried"])}
            continue
        for volatile in ("commit_tokens", "born", "buried", "seq_hi"):
            doc.pop(volatile, None)
        doc["data"] = json.loads(doc["data"])
        for array in ("outbox", "spawns"):
            seqs = [e["seq"] for e in doc.get(array, [])]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), (doc["_id"], array, seqs)
        doc["outbox"] = [(e["target_id"], json.loads(e["event"])) for e in doc.get("outbox", [])]
        doc["spawns"] = [(s["parent_id"], s["child_id"], s["root_path"], s["context"]) for s in doc.get("spawns", [])]
        out[doc["_id"]] = doc
    return out


def scenario(store: Any, coll: Any, after_create: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Run the whole scenario through `store` (any failures retried by the caller) and
    return the snapshots taken along the way (by a client no fault reaches)."""
    caller = Caller(store)
    shots: dict[str, Any] = {}
    caller.retry(store.init)
    caller.create(
        Execution(id=X, definition_id="d", context={"log": []}),
        emits=[(PEER, Event(id="hello", kind="Hello"))],
        timers=(TimerOp("schedule", "Wait", 10.0),),
        spawns=((X + ":kid", "Fork.A", {"k": 1}),),
        trace={"step": "create"},
    )
    after_create()
    outcomes = [caller.deliver(X, ev, effects) for ev in [EVENTS[0], EVENTS[1], EVENTS[0], EVENTS[2]]]
    # a redelivery after a commit that landed unseen is a duplicate too; the repeat always is
    assert outcomes[2] == "duplicate" and set(outcomes) <= {"handled", "duplicate"}
    shots["advanced"] = snapshot(coll)
    delivered = []
    for e in caller.retry(store.pending_outbox):
        if e.target_id == PEER:  # X's emits; the peer's entries stay for the purge to find
            caller.retry(lambda e=e: store.ack_outbox(e.seq))
            delivered.append(e.event.id)
    spawned = []
    for s in caller.retry(store.pending_spawns):
        caller.retry(lambda s=s: store.ack_spawn(s.seq))
        spawned.append(s.child_id)
    fired = []
    for exe_id, path, at in caller.retry(lambda: store.due_timers(100.0)):
        caller.retry(lambda t=(exe_id, path, at): store.delete_timer(*t))
        fired.append((exe_id, path, at))
    shots["relayed"] = snapshot(coll)
    shots["handled"] = {"delivered": delivered, "spawned": spawned, "fired": fired}
    version = shots["relayed"][X]["version"]

    def purge() -> None:
        if not store.purge(X, version):
            assert store.load(X) is None  # an earlier attempt deleted it: its reply was lost
            caller.seen["purge retried"] += 1

    caller.retry(purge)
    shots["purged"] = snapshot(coll)
    shots["caller saw"] = caller.seen
    return shots


def expect_same(faulted: dict[str, Any], baseline: dict[str, Any]) -> None:
    for stage in ("advanced", "relayed", "handled", "purged"):
        assert faulted[stage] == baseline[stage], stage


# --- per-run databases and stores ---------------------------------------------------------


class Run:
    """A fresh database, its raw collection and a command log; stores built on demand."""

    def __init__(self, url: str, admin: pymongo.MongoClient[Any]) -> None:
        self.url = url
        self.admin = admin
        self.db = "hbf_" + uuid.uuid4().hex[:10]
        self.coll = admin[self.db]["harel_executions"]
        self.log = Recorder()
        self.closers: list[Callable[[], None]] = []
        setup_peer(self.coll)

    def sync_store(self, cls: type[MongoStore] = MongoStore, **client: Any) -> Any:
        c: pymongo.MongoClient[Any] = pymongo.MongoClient(self.url, **self.client_options(client))
        store = cls(c, self.db)
        self.closers.append(store.close)
        return store

    def async_store(self, cls: type[AsyncMongoStore] = AsyncMongoStore, **client: Any) -> Any:
        url, db = self.url, self.db
        options = self.client_options(client)
        facade = BlockingAsyncStore(lambda: cls(pymongo.AsyncMongoClient(url, **options), db))
        self.closers.append(facade.shutdown)
        return facade

    def client_options(self, extra: dict[str, Any]) -> dict[str, Any]:
        # after a network or "shutting down" error the driver re-checks the server before it
        # selects it again, at most every heartbeatFrequencyMS (500 is the least it allows)
        return {"appName": VICTIM, "event_listeners": [self.log], "heartbeatFrequencyMS": 500, **extra}

    def store(self, kind: str, **client: Any) -> Any:
        return self.sync_store(**client) if kind == "sync" else self.async_store(**client)

    def close(self) -> None:
        self.admin.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
        closers, self.closers = self.closers, []
        for close in closers:
            close()
        self.admin.drop_database(self.db)


@pytest.fixture
def runs(fault_url: str, admin: pymongo.MongoClient[Any]) -> Iterator[Callable[[], Run]]:
    made: list[Run] = []

    def make() -> Run:
        made.append(Run(fault_url, admin))
        return made[-1]

    yield make
    for r in made:
        r.close()


_baselines: dict[str, dict[str, Any]] = {}


Sent = list[tuple[str, dict[str, Any]]]  # commands as the Recorder keeps them: (name, command)


def baseline(runs: Callable[[], Run], kind: str) -> tuple[dict[str, Any], list[str]]:
    """The fault-free run's snapshots and the names of the commands it sent (computed once per
    store; `baseline_commands` has the commands themselves)."""
    if kind not in _baselines:
        run = runs()
        shots = scenario(run.store(kind), run.coll)
        assert not shots["caller saw"] and not run.log.faults
        _baselines[kind] = {"shots": shots, "commands": run.log.names(), "sent": list(run.log.commands)}
    return _baselines[kind]["shots"], _baselines[kind]["commands"]


def baseline_commands(runs: Callable[[], Run], kind: str) -> Sent:
    baseline(runs, kind)
    sent: Sent = _baselines[kind]["sent"]
    return sent


# --- which command a fault hit --------------------------------------------------------------

# The failCommand fail point picks its command by name only (SecantusDB has no `namespace`
# filter, and mongod only from 7.0): `skip` counts the commands of those names before the one
# to fail. A test names the command it means with one of these, finds its `skip` in the
# fault-free run, and checks in its own run's log that the fault hit exactly that command.
Wanted = Callable[[str, dict[str, Any]], bool]


def _first_update(c: dict[str, Any]) -> dict[str, Any]:
    first: dict[str, Any] = c["updates"][0]
    return first


WIRE: dict[str, Wanted] = {
    "the creation": lambda n, c: n == "insert" and c["insert"] == "harel_executions",
    "the first event's commit": lambda n, c: (
        n == "update"
        and c["update"] == "harel_executions"
        and isinstance(_first_update(c)["u"], dict)
        and "commit_tokens" in _first_update(c)["u"].get("$push", {})
    ),
    "the first ack": lambda n, c: (
        n == "update" and c["update"] == "harel_executions" and "outbox.seq" in _first_update(c)["q"]
    ),
}


def skip_to(sent: Sent, names: list[str], wanted: Wanted) -> int:
    """The fail point's `skip` for the first command `wanted` picks out of `sent`: how many
    commands named in `names` come before it."""
    for i, (name, command) in enumerate(sent):
        if wanted(name, command):
            assert name in names, (name, names)
            return sum(1 for n, _ in sent[:i] if n in names)
    raise AssertionError("the scenario never sends the command the test means")


def where(hits: list[Hit]) -> list[tuple[int, str, str, str]]:
    return [(h.at, h.fault, h.name, h.collection) for h in hits]


def assert_hit(log: Recorder, fault: str, wanted: Wanted, since: int = 0) -> Hit:
    """The run's one fault is `fault`, on the first command (from index `since`) `wanted`
    picks out of the run's log."""
    first = next((i for i, (n, c) in enumerate(log.commands) if i >= since and wanted(n, c)), None)
    assert first is not None, "the run never sent the command the fault was meant for"
    name, command = log.commands[first]
    assert where(log.hits) == [(first, fault, name, command[name])], (first, where(log.hits))
    return log.hits[0]


def still_held(admin: pymongo.MongoClient[Any], hit: Hit) -> bool:
    """Whether the server is still on the command `hit` answered: its connection, which the
    client closed when it gave up, is listed by `currentOp` until the server has run the
    command and found the connection gone."""
    assert hit.connection is not None, "the server did not say which connection it was"
    return any(op.get("connectionId") == hit.connection for op in admin.admin.command("currentOp")["inprog"])


def wait_until_run(admin: pymongo.MongoClient[Any], hit: Hit, within: float) -> None:
    deadline = time.monotonic() + within
    while still_held(admin, hit):
        assert time.monotonic() < deadline, f"the held {hit.name} was still on the server after {within} s"
        time.sleep(0.05)


# --- 1. failCommand at every step -----------------------------------------------------------

READS_AND_WRITES = ["createIndexes", "find", "insert", "update", "delete", "findAndModify"]
WRITES = ["insert", "update", "delete", "findAndModify"]
FAULTS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "connection closed": (READS_AND_WRITES, {"closeConnection": True}),
    "ShutdownInProgress": (READS_AND_WRITES, {"errorCode": 91}),
    "MaxTimeMSExpired": (READS_AND_WRITES, {"errorCode": 50}),
    "command error": (READS_AND_WRITES, {"errorCode": 8}),  # UnknownError: a definite failure
    "writeConcernError (applied)": (
        WRITES,
        {"writeConcernError": {"code": 64, "errmsg": "waiting for replication timed out"}},
    ),
}
# how each fault shows in the client's command log (tests/support/wire.py)
SEEN_AS = {
    "connection closed": "AutoReconnect",
    "ShutdownInProgress": "ShutdownInProgress",
    "MaxTimeMSExpired": "MaxTimeMSExpired",
    "command error": "UnknownError",
    "writeConcernError (applied)": "writeConcernError",
}


def arm(
    admin: pymongo.MongoClient[Any], commands: list[str], data: dict[str, Any], *, skip: int, times: int = 1
) -> None:
    admin.admin.command(
        {
            "configureFailPoint": "failCommand",
            "mode": {"skip": skip, "times": times} if skip else {"times": times},
            "data": {"failCommands": commands, "appName": VICTIM, **data},
        }
    )


def assert_fired(log: Recorder, fault: str, skip: int, times: int = 1) -> None:
    """The fail point armed with `fault` at `skip` fired on exactly the commands it counts to:
    of the run's commands named in the fault's targets, the `times` from the `skip`-th on
    (fewer when the run sent fewer), each as the fault shows on the client, and on no other."""
    targets, _ = FAULTS[fault]
    counted = [i for i, (n, _) in enumerate(log.commands) if n in targets]
    meant = [(i, SEEN_AS[fault], *log.commands[i]) for i in counted[skip : skip + times]]
    expected = [(i, seen, name, command[name]) for i, seen, name, command in meant]
    assert where(log.hits) == expected, (skip, times, where(log.hits))


def sweep(
    runs: Callable[[], Run], admin: pymongo.MongoClient[Any], kind: str, fault: str, stride: int = 1
) -> dict[str, int]:
    base, commands = baseline(runs, kind)
    targets, data = FAULTS[fault]
    hits = sum(1 for n in commands if n in targets)
    tally: Counter[str] = Counter()
    for k in range(0, hits, stride):
        run = runs()
        store = run.store(kind)
        arm(admin, targets, data, skip=k)
        shots = scenario(store, run.coll)
        admin.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
        assert_fired(run.log, fault, skip=k)
        expect_same(shots, base)
        tally.update(run.log.faults)
        tally.update({"caller saw " + k: v for k, v in shots["caller saw"].items()})
        tally["runs"] += 1
        run.close()
    return dict(tally)


# Each fault that makes the driver re-check the server costs about half a second (the least
# heartbeat interval it allows). The default run fails every command of the sync store for
# the two faults that matter most (a dropped connection, a write applied under an error) and
# every n-th for the others and the async store; `make soak` fails every command for every
# fault on both stores.
DEFAULT_STRIDES = {
    "sync": {"ShutdownInProgress": 6, "MaxTimeMSExpired": 2, "command error": 3},
    "async": {
        "connection closed": 5,
        "ShutdownInProgress": 7,
        "MaxTimeMSExpired": 3,
        "command error": 4,
        "writeConcernError (applied)": 2,
    },
}


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_at_any_command_changes_nothing(runs, admin, kind, fault, figures):
    """A failCommand fail point at the k-th command of the scenario, on either store:
    connection closed, `ShutdownInProgress` and `MaxTimeMSExpired` (outcome unknown to the
    driver), a plain command error, and a `writeConcernError` returned after the write was
    applied (Temporal's "execute and timeout"). The default run takes every command for the
    sync store's dropped connection and applied-then-failed write, every n-th otherwise.
    Every run ends with the fault-free run's documents."""
    figures.set(**sweep(runs, admin, kind, fault, stride=DEFAULT_STRIDES[kind].get(fault, 1)))


@pytest.mark.soak
@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_at_every_command_changes_nothing_soak(runs, admin, kind, fault, figures):
    """Every command of the scenario (its writes for the writeConcernError) failed in turn by
    each fault, on both stores: every run ends with the fault-free run's documents."""
    figures.set(**sweep(runs, admin, kind, fault, stride=1))


def test_the_scenario_uses_only_the_commands_the_faults_cover(runs):
    """The scenario sends only `createIndexes`, `find`, `findAndModify`, `insert`, `update` and
    `delete`: the commands the fault sweeps fail; besides them, its set-up asks `hello` once
    (whether it talks to a mongos), which a failure of fails the set-up as a lost server does."""
    _, commands = baseline(runs, "sync")
    assert set(commands) - {"hello"} <= STORE_COMMANDS, set(commands) - STORE_COMMANDS
    assert commands.count("hello") == 1, commands
    _, acommands = baseline(runs, "async")
    assert set(acommands) - {"listCollections", "buildInfo", "listIndexes", "hello"} <= STORE_COMMANDS


AGGREGATES = {
    "aggregate": {"pipeline": [], "cursor": {}},
    "count": {},
    "distinct": {"key": "_id"},
    "mapReduce": {"map": "function () {}", "reduce": "function (k, v) { return 0; }", "out": {"inline": 1}},
}


def test_the_store_never_sends_an_aggregate(runs, admin):
    """Faults on `aggregate` are among the ones to try: the store sends none (every read is a find,
    the pipeline of `delete_timer` is an update), so failing every aggregate, count, distinct
    and mapReduce changes nothing. The fail point stays armed through the run: after it, each of
    those commands from a client of the store's appName is still refused with its error."""
    base, _ = baseline(runs, "sync")
    for kind in ("sync", "async"):
        run = runs()
        store = run.store(kind)
        admin.admin.command(
            {
                "configureFailPoint": "failCommand",
                "mode": "alwaysOn",
                "data": {"failCommands": list(AGGREGATES), "appName": VICTIM, "errorCode": 8},
            }
        )
        shots = scenario(store, run.coll)
        probe: pymongo.MongoClient[Any] = pymongo.MongoClient(run.url, appName=VICTIM)
        for name, args in AGGREGATES.items():
            with pytest.raises(OperationFailure) as refused:
                probe[run.db].command({name: "harel_executions", **args})
            assert refused.value.code == 8, (name, refused.value.details)
        probe.close()
        admin.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
        expect_same(shots, base)
        assert not run.log.faults and not set(AGGREGATES) & set(run.log.names())


@pytest.mark.soak
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_random_bursts_of_faults_soak(runs, admin, kind, figures):
    """Many runs, each with a burst of 1-3 consecutive failures of a random kind starting at
    a random command, each checked to have failed exactly the commands it counted to: every
    run ends with the fault-free run's documents."""
    base, commands = baseline(runs, kind)
    rng = random.Random(f"{kind}-20261202")
    tally: Counter[str] = Counter()
    for _ in range(300):
        run = runs()
        store = run.store(kind)
        fault = rng.choice(list(FAULTS))
        targets, data = FAULTS[fault]
        hits = sum(1 for n in commands if n in targets)
        skip, times = rng.randrange(hits), rng.randint(1, 3)
        arm(admin, targets, data, skip=skip, times=times)
        shots = scenario(store, run.coll)
        admin.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
        assert_fired(run.log, fault, skip, times)
        expect_same(shots, base)
        tally.update(run.log.faults)
        tally["runs"] += 1
        run.close()
    figures.set(**tally)


# --- 2. a write blocked past the client's timeout, applied after the client gave up ------------


CLIENT_WAIT_MS = 400  # the store's client gives up on a reply after this long
HOLD_MS = 900  # the server holds the write this long


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("write", ["the first event's commit", "the first ack"])
def test_a_write_applied_after_the_client_timed_out_changes_nothing(runs, admin, kind, write):
    """The server holds one update (the first event's commit, or the first outbox ack) past the
    client's socket timeout: the client sees a NetworkTimeout on that update and the store
    re-sends; the held write runs later (the test waits until the server is done with it) and
    loses the CAS (a commit) or finds nothing left to do (an ack)."""
    base, _ = baseline(runs, kind)
    run = runs()
    store = run.store(kind, socketTimeoutMS=CLIENT_WAIT_MS)
    store.init()
    skip = skip_to(baseline_commands(runs, kind), ["update"], WIRE[write])
    arm(admin, ["update"], {"blockConnection": True, "blockTimeMS": HOLD_MS}, skip=skip)
    shots = scenario(store, run.coll)
    held = assert_hit(run.log, "NetworkTimeout", WIRE[write])
    wait_until_run(admin, held, within=HOLD_MS / 1000 + 30)
    expect_same(shots, base)
    assert snapshot(run.coll) == base["purged"]


class RaceMissed(Exception):
    """The held insert ran before the point the test holds it past (a slow run): try again
    with a longer hold."""


def hold_the_creation(
    runs: Callable[[], Run], admin: pymongo.MongoClient[Any], kind: str, hold_ms: int
) -> tuple[Run, Any]:
    """A fresh run whose store's client gives up on a reply after CLIENT_WAIT_MS, with the
    fail point armed to hold the creation's insert (into the executions collection, not the
    seq lease's into the counters before it) for `hold_ms`."""
    run = runs()
    store = run.store(kind, socketTimeoutMS=CLIENT_WAIT_MS)
    store.init()
    skip = skip_to(baseline_commands(runs, kind), ["insert"], WIRE["the creation"])
    arm(admin, ["insert"], {"blockConnection": True, "blockTimeMS": hold_ms}, skip=skip)
    return run, store


def the_resend_made_it(run: Run, admin: pymongo.MongoClient[Any]) -> Hit:
    """The creation's insert timed out on the client and the store's re-send of it made the
    execution (no duplicate key: the held insert had not run), while the server still holds
    the first (else `RaceMissed`)."""
    held = assert_hit(run.log, "NetworkTimeout", WIRE["the creation"])
    sent = [i for i, (n, c) in enumerate(run.log.commands) if WIRE["the creation"](n, c)]
    if len(sent) < 2 or sent[-1] in run.log.write_errors or not still_held(admin, held):
        raise RaceMissed
    return held


def until_the_race_happens(attempt: Callable[[int], None], holds_ms: tuple[int, ...]) -> int:
    """Run `attempt` with each hold in turn until one is long enough for the race; the hold."""
    for hold in holds_ms:
        try:
            attempt(hold)
            return hold
        except RaceMissed:
            continue
    raise AssertionError(f"the held insert ran too soon at every hold tried: {holds_ms} ms")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_held_insert_that_lands_late_is_refused_by_the_id(runs, admin, kind, figures):
    """The creation's insert into the executions collection is held past the client's timeout:
    the client sees a NetworkTimeout on that insert, and the store re-sends it, which makes the
    execution while the server still holds the first. When the held insert runs the id is
    taken, so it writes nothing: the execution is unchanged, and the run ends with the
    fault-free run's documents. A run too slow for the race is tried again with a longer hold
    (up to 6 s), never passed or skipped without it."""
    base, _ = baseline(runs, kind)

    def attempt(hold_ms: int) -> None:
        run, store = hold_the_creation(runs, admin, kind, hold_ms)

        def the_held_insert_runs() -> None:
            held = the_resend_made_it(run, admin)
            created = run.coll.find_one({"_id": X})
            wait_until_run(admin, held, within=hold_ms / 1000 + 30)
            assert run.coll.find_one({"_id": X}) == created

        shots = scenario(store, run.coll, after_create=the_held_insert_runs)
        expect_same(shots, base)

    figures.set(hold_ms=until_the_race_happens(attempt, (HOLD_MS, 2500, 6000)))


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_held_insert_landing_after_a_purge_does_not_resurrect_the_execution(runs, admin, kind, figures):
    """As above, but the server still holds the first insert when the whole scenario (purge
    included) is over: the purge left a tombstone holding the id, so when the held insert runs
    it fails on the id instead of writing the execution at version 1 again with its emit,
    spawn and timer pending. A run too slow for that is tried again with a longer hold (up to
    12 s), never passed or skipped without it."""
    base, _ = baseline(runs, kind)

    def attempt(hold_ms: int) -> None:
        run, store = hold_the_creation(runs, admin, kind, hold_ms)
        scenario(store, run.coll)
        held = the_resend_made_it(run, admin)
        wait_until_run(admin, held, within=hold_ms / 1000 + 30)
        assert snapshot(run.coll) == base["purged"]  # X stays purged

    figures.set(hold_ms=until_the_race_happens(attempt, (1800, 5000, 12000)))


# --- 3. pymongo's retryable writes ----------------------------------------------------------


def test_no_driver_retry_on_a_standalone_server(runs, admin):
    """On a standalone server pymongo does not retry writes: after a dropped connection on the
    commit's update the store itself re-sends the same write, under the same commit token (so a
    first send that lands late is still recognised as this commit)."""
    run = runs()
    store = run.sync_store()
    exe = Execution(id="r", definition_id="d")
    store.commit(exe, [])
    since = len(run.log.commands)
    arm(admin, ["update"], {"closeConnection": True}, skip=0)
    store.commit(exe, [(None, Event(kind="A"))])
    assert_hit(run.log, "AutoReconnect", WIRE["the first event's commit"], since)
    updates = [c for n, c in run.log.commands[since:] if n == "update"]
    assert len(updates) == 2 and all("txnNumber" not in u for u in updates)
    tokens = [u["updates"][0]["u"]["$push"]["commit_tokens"]["$each"][0] for u in updates]
    assert tokens[0] == tokens[1]
    doc = run.coll.find_one({"_id": "r"})
    assert doc["version"] == 2 and len(doc["outbox"]) == 1 and doc["commit_tokens"][-1] == tokens[0]


def test_driver_retryable_writes_compose_with_the_commit_token():
    """Against a replica set pymongo retries a write once itself (same txnNumber, same
    commit token), and the server runs it once: the store sees plain success."""
    with EmbeddedServer(test_commands=True, standalone=False) as server:
        admin: pymongo.MongoClient[Any] = pymongo.MongoClient(server.url)
        store = MongoStore(pymongo.MongoClient(server.url, appName=VICTIM), "rs")
        exe = Execution(id="r", definition_id="d")
        store.commit(exe, [])
        for data, fault in (
            ({"closeConnection": True}, "AutoReconnect"),
            ({"blockConnection": True, "blockTimeMS": HOLD_MS}, "NetworkTimeout"),
        ):
            arm(admin, ["update"], data, skip=0)
            timeout = {"socketTimeoutMS": CLIENT_WAIT_MS} if "blockConnection" in data else {}
            log = Recorder()
            s = MongoStore(pymongo.MongoClient(server.url, appName=VICTIM, event_listeners=[log], **timeout), "rs")
            fresh = s.load("r")
            since = len(log.commands)
            s.commit(fresh, [(None, Event(kind="A"))], processed_event_id=f"ev{fresh.version}")
            hit = assert_hit(log, fault, WIRE["the first event's commit"], since)
            if "blockConnection" in data:
                wait_until_run(admin, hit, within=HOLD_MS / 1000 + 30)  # the held first send has run
            updates = [c for n, c in log.commands[since:] if n == "update"]
            assert len(updates) == 2, updates
            assert updates[0]["txnNumber"] == updates[1]["txnNumber"]
            token = [u["updates"][0]["u"]["$push"]["commit_tokens"]["$each"][0] for u in updates[:2]]
            assert token[0] == token[1]
            s.close()
        doc = admin.rs.harel_executions.find_one({"_id": "r"})
        assert doc["version"] == 3 and len(doc["outbox"]) == 2 and doc["processed"] == ["ev1", "ev2"]
        store.close()
        admin.close()


# --- 4. the store's own calls, failed deterministically per write kind ----------------------


def _removes(c: Any, array: str) -> bool:
    """An ack's write: `$pull` from `array`, or (on a real server) the update pipeline that
    filters `array` and recomputes the `pending` flag in the same write."""
    if isinstance(c.update, dict):
        return array in c.update.get("$pull", {})
    return array in c.update[0].get("$set", {})


WRITE_KINDS: dict[str, Callable[[calls.Call], bool]] = {
    "insert of a new execution": lambda c: isinstance(c, calls.InsertOne) and c.target == "executions",
    "commit update": lambda c: (
        isinstance(c, calls.UpdateOne) and isinstance(c.update, dict) and "commit_tokens" in c.update.get("$push", {})
    ),
    "ack_outbox": lambda c: isinstance(c, calls.UpdateOne) and _removes(c, "outbox"),
    "ack_spawn": lambda c: isinstance(c, calls.UpdateOne) and _removes(c, "spawns"),
    "delete_timer": lambda c: (
        isinstance(c, calls.UpdateOne) and isinstance(c.update, list) and "$project" in c.update[0]
    ),
    "purge": lambda c: isinstance(c, calls.ReplaceOne) and "tomb" in c.replacement,
    "purge's cleanup": lambda c: isinstance(c, calls.UpdateMany),
}
MODES = ["applied, reply lost", "dropped", "applied late"]


class Plan:
    """Which call to fail and how: the `nth` call matching `kind`, in `mode`."""

    def __init__(self, kind: str, mode: str, nth: int = 0) -> None:
        self.match = WRITE_KINDS[kind]
        self.mode = mode
        self.nth = nth
        self.fired = 0
        self.late: Optional[calls.Call] = None

    def before(self, c: calls.Call) -> bool:
        """True when this call must fail; `applied late` keeps it to run after the next call."""
        if self.fired or not self.match(c):
            return False
        if self.nth:
            self.nth -= 1
            return False
        self.fired = 1
        if self.mode == "applied late":
            self.late = c
        return True


class FaultySync(MongoStore):
    plan: Optional[Plan] = None

    def _call(self, c: calls.Call) -> Any:
        plan = self.plan
        if plan is not None and plan.before(c):
            if plan.mode == "applied, reply lost":
                super()._call(c)
            raise AutoReconnect(f"injected: {plan.mode}")
        result = super()._call(c)
        if plan is not None and plan.late is not None:
            late, plan.late = plan.late, None
            try:
                super()._call(late)
            except PyMongoError:
                pass  # e.g. a late insert that a re-send already made
        return result


class FaultyAsync(AsyncMongoStore):
    plan: Optional[Plan] = None

    async def _call(self, c: calls.Call) -> Any:
        plan = self.plan
        if plan is not None and plan.before(c):
            if plan.mode == "applied, reply lost":
                await super()._call(c)
            raise AutoReconnect(f"injected: {plan.mode}")
        result = await super()._call(c)
        if plan is not None and plan.late is not None:
            late, plan.late = plan.late, None
            try:
                await super()._call(late)
            except PyMongoError:
                pass
        return result


def faulty(run: Run, kind: str, plan: Plan) -> Any:
    if kind == "sync":
        store = run.sync_store(FaultySync)
        store.plan = plan
        return store
    facade = run.async_store(FaultyAsync)
    facade.inner.plan = plan
    return facade


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("write", list(WRITE_KINDS))
def test_a_write_whose_outcome_the_caller_never_learned(runs, kind, mode, write):
    """Temporal's "execute and timeout", per write kind and per store: the write applied with
    its reply lost, dropped, or applied only after the store's next call. The caller's
    retries end in exactly the fault-free state."""
    base, _ = baseline(runs, kind)
    plan = Plan(write, mode)
    run = runs()
    shots = scenario(faulty(run, kind, plan), run.coll)
    assert plan.fired, "the fault never fired"
    expect_same(shots, base)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_every_commit_of_the_scenario_survives_a_lost_reply(runs, kind, figures):
    """The lost reply at the later commits of the scenario too (the matrix above takes the
    first): the second and third event's commits."""
    base, _ = baseline(runs, kind)
    for nth in (1, 2):
        for mode in MODES:
            run = runs()
            plan = Plan("commit update", mode, nth)
            shots = scenario(faulty(run, kind, plan), run.coll)
            assert plan.fired
            expect_same(shots, base)
            figures.add(replies_lost_or_late=1)


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("write", ["insert of a new execution", "commit update"])
def test_a_commit_applied_late_is_reported_as_landed(runs, kind, write):
    """docs/design.md, "Durability": a commit whose reply is lost is resolved by its token,
    "reports success if it landed". Here the first send lands just after the store's read-back (a server still
    running the write when the client gave up): the store re-sends under a new token, that
    write loses the CAS to the first one, and the stored token is the first send's, which
    the store has forgotten."""
    run = runs()
    plan = Plan(write, "applied late")
    store = faulty(run, kind, plan)
    exe = Execution(id="late", definition_id="d")
    if write == "commit update":
        store.commit(exe, [])  # the creation; the fault waits for the update after it
        exe = store.load("late")
    seqs = store.commit(exe, [(None, Event(id="once", kind="A"))], processed_event_id="in")
    assert plan.fired, "the fault never fired"
    doc = run.coll.find_one({"_id": "late"})
    assert [json.loads(e["event"])["id"] for e in doc["outbox"]] == ["once"]
    assert seqs == [doc["outbox"][0]["seq"]] and exe.version == doc["version"]
