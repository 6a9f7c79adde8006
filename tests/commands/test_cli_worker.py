"""`harel-beanie worker` drains the work another process publishes, on this package's
transport (its default) and on harel's Mongo transport (`--transport harel`), and stops on
SIGTERM without losing what was in flight."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from typing import Any

import pymongo
import pytest
from harel.engine.aio.distributed import AsyncDistributedRunner
from harel.engine.execution import Status
from harel.engine.schema import Names

from harel_beanie import AsyncMongoStore
from harel_beanie.core.names import queue_names
from harel_beanie.deploy.loader import load_models
from harel_beanie.deploy.stack import queued
from harel_beanie.harness.drivers import open_mongo_transport
from harel_beanie.transport import AsyncMongoTransport
from tests.commands.test_cli import MODELS, cli_env


@pytest.fixture(params=["beanie", "harel"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def sender_transport(kind: str, mongo_url: str, db_name: str) -> Any:
    """The transport the sending process publishes on: the one the worker reads."""
    if kind == "harel":
        return await open_mongo_transport(mongo_url, db_name)
    return AsyncMongoTransport(pymongo.AsyncMongoClient(mongo_url), db_name)


async def held(db: Any, kind: str) -> int:
    """Leases held on transport `kind`: groups whose head a worker holds."""
    if kind == "harel":
        return int(await db[Names("harel").transport_locks].count_documents({"token": {"$ne": None}}))
    return int(await db[queue_names("harel")[0]].count_documents({"token": {"$ne": None}, "pending": {"$gt": 0}}))


async def queued_groups(db: Any, kind: str) -> set[str]:
    if kind == "harel":
        return {m["group_id"] for m in await db[Names("harel").messages].find({}, {"group_id": 1}).to_list(None)}
    return {d["_id"] for d in await db[queue_names("harel")[0]].find({"pending": {"$gt": 0}}).to_list(None)}


def worker_argv(mongo_url: str, db_name: str, *extra: str) -> list[str]:
    """`harel-beanie worker` on the shop models, on the test's server and database."""
    return [
        sys.executable,
        "-m",
        "harel_beanie",
        "worker",
        "--url",
        mongo_url,
        "--db",
        db_name,
        "--definitions",
        str(MODELS),
        *extra,
    ]


async def start_worker(mongo_url: str, db_name: str, worker_id: str, *extra: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        worker_argv(mongo_url, db_name, "--worker-id", worker_id, *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    assert proc.stdout is not None
    before = ""
    while True:  # the ready line, after whatever it says while starting
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=60)
        if " ready: " in line:
            return proc, before + line
        before += line
        if not line:
            proc.kill()
            raise AssertionError(f"no ready line: {before!r} {proc.stderr.read() if proc.stderr else ''}")


def stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out, err)
    assert "Traceback" not in err, err
    return out, err


async def wait_for(predicate: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_worker_drains_published_work_and_stops_cleanly(mongo_url, db_name, astore, kind):
    proc, ready = await start_worker(mongo_url, db_name, "w-drain", "--concurrency", "8", "--transport", kind)
    try:
        assert ready.startswith(f"worker w-drain ready: {mongo_url} database {db_name} prefix harel")
        assert "3 machines" in ready and "Order, Payment, PickLine" in ready and f"transport {kind}" in ready
        transport = await sender_transport(kind, mongo_url, db_name)
        sender = AsyncDistributedRunner(astore, transport, load_models(MODELS))
        expected = {}
        for i in range(4):
            await sender.create("Payment", {"order_id": f"p{i}", "amount": 5.0}, execution_id=f"pay-{i}")
            expected[f"pay-{i}"] = "Captured"
        await sender.create("Payment", {"order_id": "b", "card": "blocked"}, execution_id="pay-blocked")
        expected["pay-blocked"] = "Declined"
        await sender.create("PickLine", {"sku": "OOS-1"}, execution_id="pick-short")
        expected["pick-short"] = "Short"
        # an order pays through its invoked Payment child (an event relayed between two
        # executions), then waits 15 minutes of real time cooling off: RUNNING, timer armed
        await sender.create("Order", {"order_id": "o1", "amount": 9.5, "lines": ["SKU-1"]}, execution_id="order-1")
        db = pymongo.AsyncMongoClient(mongo_url)[db_name]

        async def drained() -> bool:
            loaded = {i: await astore.load(i) for i in [*expected, "order-1"]}
            if any(e is None for e in loaded.values()):
                return False
            ended = all(loaded[i].status.value == "DONE" for i in expected)
            cooling = loaded["order-1"].active_path == "CoolingOff"
            return ended and cooling and await queued(db, "harel", kind) == 0

        await wait_for(drained)
        for i, state in expected.items():
            assert (await astore.load(i)).active_path == state
        assert [t[:2] for t in await astore.due_timers(float("inf"))] == [("order-1", "CoolingOff")]
        assert await astore.pending_outbox() == [] and await astore.pending_spawns() == []

        # after a sweep, the worker has taken this minute's sample (what `status`, the backlog
        # page and /metrics take the pending entries from: queries.samples)
        async def sampled() -> bool:
            return await db["harel_hb_samples"].find_one({"executions": {"$gte": len(expected) + 1}}) is not None

        await wait_for(sampled, timeout=90.0)  # a sample taken early waits for the next minute
        await transport.close()
    finally:
        out, err = stop(proc)
    assert "worker w-drain stopping (SIGTERM)" in out
    handled = int(out.split("stopped: ")[1].split()[0])
    assert handled >= len(expected) + 1  # every Start, plus the order's Returned


async def test_sigterm_with_events_in_flight_loses_nothing(mongo_url, db_name, astore, kind):
    """Stopped mid-stream, the worker finishes what it holds and releases the rest: every
    execution is done or still queued, no lease is left held, and a second worker finishes."""
    transport = await sender_transport(kind, mongo_url, db_name)
    sender = AsyncDistributedRunner(astore, transport, load_models(MODELS))
    ids = [f"pay-{i:02d}" for i in range(60)]
    for i in ids:  # queued before any worker runs
        await sender.create("Payment", {"order_id": i, "amount": 1.0}, execution_id=i)
    proc, _ = await start_worker(mongo_url, db_name, "w-first", "--concurrency", "2", "--transport", kind)
    try:

        async def some_done() -> bool:
            return bool((await astore.list_executions(status=[Status.DONE], limit=1)).items)

        await wait_for(some_done)
    finally:
        out, _ = stop(proc)
    assert "stopped:" in out
    db = pymongo.AsyncMongoClient(mongo_url)[db_name]
    assert await held(db, kind) == 0  # nothing held
    waiting = await queued_groups(db, kind)
    done = 0
    for i in ids:
        e = await astore.load(i)
        assert e is not None and (e.status.value == "DONE" or i in waiting), (i, e)
        done += e.status.value == "DONE"
    assert 0 < done < len(ids) and waiting  # it really stopped mid-stream

    second, _ = await start_worker(mongo_url, db_name, "w-second", "--transport", kind)
    try:

        async def all_done() -> bool:
            loaded = [await astore.load(i) for i in ids]
            return all(e is not None and e.active_path == "Captured" for e in loaded)

        await wait_for(all_done)
    finally:
        stop(second)
    await transport.close()


async def test_worker_relays_what_an_earlier_worker_left_pending(mongo_url, db_name, astore):
    """An outbox entry committed but never relayed (its worker died in between) is relayed
    when a worker starts: the event reaches its target."""
    from harel.engine.execution import Execution
    from harel.spec.states import Event

    transport = await sender_transport("beanie", mongo_url, db_name)
    sender = AsyncDistributedRunner(astore, transport, load_models(MODELS))
    # the target will wait on its gateway's 1-minute retry timer; the orphan cancels it
    await sender.create("Payment", {"order_id": "t", "flaky_attempts": 9}, execution_id="target")
    orphan = Execution(id="emitter", definition_id="Payment", status=Status.RUNNING, updated_at=time.time())
    await astore.commit(orphan, [("target", Event(id="left-behind", kind="Cancel"))])
    assert len(await astore.pending_outbox()) == 1
    proc, started = await start_worker(mongo_url, db_name, "w-sweep")
    try:
        assert "relayed the pending work of 1 execution(s) left by earlier workers" in started

        async def relayed() -> bool:
            target = await astore.load("target")
            return not await astore.pending_outbox() and target is not None and target.active_path == "Voided"

        await wait_for(relayed)
        assert await astore.is_processed("target", "left-behind")
    finally:
        stop(proc)
    await transport.close()


async def test_the_worker_refuses_to_strand_the_other_transports_messages(mongo_url, db_name, astore):
    """Messages waiting in harel's transport are never read by a worker on this package's:
    it refuses to start, naming the command that moves them, and starts on harel's."""
    transport = await open_mongo_transport(mongo_url, db_name)
    await AsyncDistributedRunner(astore, transport, load_models(MODELS)).create(
        "Payment", {"order_id": "x", "amount": 1.0}, execution_id="stranded"
    )
    await transport.close()
    proc = subprocess.run(
        worker_argv(mongo_url, db_name),
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
    )
    assert proc.returncode == 2 and "1 message(s) wait in the harel transport" in proc.stderr, proc.stderr
    assert "harel-beanie migrate-transport up" in proc.stderr


async def test_a_connection_lost_while_starting_does_not_end_the_worker(tmp_path):
    """The server answers the worker's first ping, then closes the connection under the
    store's set-up (a fail point on `createIndexes`, twice): the worker retries its start-up
    and gets ready instead of exiting (the network-fault runs found a worker ending so)."""
    from harel_beanie.deploy.embedded import EmbeddedServer

    with EmbeddedServer(test_commands=True, log_path=tmp_path / "server.log") as server:
        admin: Any = pymongo.MongoClient(server.url)
        admin.admin.command(
            "configureFailPoint",
            "failCommand",
            mode={"times": 2},
            data={"failCommands": ["createIndexes"], "closeConnection": True},
        )
        proc, said = await start_worker(server.url, "startup", "w-start", "--connect-attempts", "10")
        assert said.count("lost the server while starting") == 2, said
        # the fail point is spent: both closes were on the store's set-up
        admin.startup.probe.create_index("x")
        stop(proc)
        admin.close()


async def test_a_write_concern_error_on_a_claim_does_not_end_the_worker(tmp_path, kind):
    """The server applies the worker's claims without their write concern (a fail point's
    `writeConcernError` on `findAndModify` and `update`, four times: this transport's claim
    leases with an `update`, as its partition leases renew, so two may all go to renewals):
    the worker says so, goes on claiming, and handles the work published meanwhile (the
    network-fault soak found a worker ending on this)."""
    from harel_beanie.deploy.embedded import EmbeddedServer

    with EmbeddedServer(test_commands=True, log_path=tmp_path / "server.log") as server:
        admin: Any = pymongo.MongoClient(server.url)
        named = server.url + ("&" if "?" in server.url else "/?") + "appName=hb-worker"  # the fail point's aim
        # a claim applied under the error may keep its lease until it lapses: a short one
        # (the default is 30 s) so the work comes back within the test's wait
        proc, _ = await start_worker(named, "wce", "w-wce", "--transport", kind, "--visibility", "5")
        try:
            wce = {"code": 64, "codeName": "WriteConcernFailed", "errmsg": "injected"}
            admin.admin.command(
                "configureFailPoint",
                "failCommand",
                mode={"times": 4},
                data={"failCommands": ["findAndModify", "update"], "writeConcernError": wce, "appName": "hb-worker"},
            )
            store = AsyncMongoStore(pymongo.AsyncMongoClient(server.url), "wce")
            transport = await sender_transport(kind, server.url, "wce")
            sender = AsyncDistributedRunner(store, transport, load_models(MODELS))
            for i in range(3):
                await sender.create("Payment", {"order_id": f"p{i}", "amount": 5.0}, execution_id=f"pay-{i}")

            async def paid() -> bool:
                loaded = [await store.load(f"pay-{i}") for i in range(3)]
                return all(e is not None and e.active_path == "Captured" for e in loaded)

            await wait_for(paid, timeout=90)
            assert proc.poll() is None
            await transport.close()
            await store.close()
        finally:
            out, err = stop(proc)
            admin.admin.command("configureFailPoint", "failCommand", mode="off")
            admin.close()
    # a claim of one group is an update (WriteConcernError); a prefetching claim of several a
    # bulk write (BulkWriteError carrying the write concern error): both are passing. On a
    # loaded machine all four may land on the periodic tasks' updates (lease renewals, the
    # counts' fold), which log the error and retry: the fault fired either way, and the
    # worker outlived it and did the work
    said = ("the server failed a command (WriteConcernError)", "the server failed a command (BulkWriteError)")
    assert any(s in out for s in said) or "'codeName': 'WriteConcernFailed'" in err, (out, err[-3000:])


@pytest.mark.parametrize(
    "query, want",
    [("", {"w": "majority", "j": True}), ("w=1", {"w": 1}), ("journal=false", {"j": False})],
    ids=["the URL names none: the store's", "w=1 in the URL", "journal=false in the URL"],
)
async def test_harels_transport_writes_at_the_stores_concern_unless_the_url_names_one(
    mongo_url: str, db_name: str, query: str, want: dict[str, Any]
) -> None:
    """harel's transport writes at its client's concern. The network-fault soak lost a publish
    acknowledged at a client's default (w: 1, no journal) to a server SIGKILL: the commands
    open it w: majority, journaled, as this package's store and transport write, unless the
    URL says otherwise."""
    url = mongo_url + ("&" if "?" in mongo_url else "/?") + query if query else mongo_url
    transport = await open_mongo_transport(url, db_name)
    try:
        assert transport._client.write_concern.document == want
    finally:
        await transport.close()


def test_a_bulk_claims_write_concern_error_is_passing() -> None:
    """A claim of k groups is one bulk write: its write concern failing, every write applied,
    is passing like a single write's (the worker goes on); a write refused is not."""
    from pymongo.errors import BulkWriteError

    from harel_beanie.deploy.serving import passing

    wce = {"code": 64, "errmsg": "injected"}
    assert passing(BulkWriteError({"writeErrors": [], "writeConcernErrors": [wce]}))
    assert not passing(BulkWriteError({"writeErrors": [{"index": 0, "code": 11000}], "writeConcernErrors": [wce]}))
    assert not passing(BulkWriteError({"writeErrors": [{"index": 0, "code": 2}], "writeConcernErrors": []}))
