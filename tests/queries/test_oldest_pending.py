"""The executions holding the oldest pending entries, by name (`harel_beanie.queries.oldest`).

An execution RUNNING with an outbox entry and a spawn pending for two hours waits on a relay:
no stuck list shows it, and the backlog used to show only the count and the oldest one's age,
so an operator reading "oldest 2h" could not find it. `/backlog`, `/api/backlog` and
`harel-beanie status` (text and `--json`) now list the executions holding the N oldest
entries of each kind, each with its dashboard page; checked here against the documents
themselves (`tests.support.pending_oracle`, written apart), through the real routes and the
real command in a process of its own.

And the list is bounded: the documents its reads examine are counted by the server's own
account (explain's `executionStats` on exactly the commands sent) and on the wire (each
filter counted again, what SecantusDB reads for it): about N per kind, the same with 50
executions holding entries as with 2,000, each read an index scan on `hb_outbox_oldest` or
`hb_spawn_oldest`.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import time
from typing import Any, Optional
from urllib.parse import quote

import httpx
import pymongo
import pytest
from fastapi import FastAPI
from harel.engine.execution import Execution, Status
from harel.spec.states import Event
from prometheus_client import CollectorRegistry

from harel_beanie import AsyncMongoStore, queries
from harel_beanie.commands import status as status_command
from harel_beanie.core.commit import CommitRequest, plan_commit
from harel_beanie.core.documents import ExecutionDocument
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, part_of
from harel_beanie.core.seqs import EPOCH_MS, MS_SHIFT, SEQ_BITS
from harel_beanie.dashboard import charts, dashboard_router, no_auth
from harel_beanie.deploy.where import RetryPolicy, Target
from harel_beanie.queries import lowest as lowest_module
from harel_beanie.queries.oldest import OLDEST, oldest_holders
from harel_beanie.queries.samples import take_sample
from harel_beanie.telemetry.metrics import StoreMetrics
from tests.commands.test_cli import cli_env
from tests.support.pending_oracle import PendingTruth, age, pending_truth

HOUR = 3600.0
MOUNT = "/ops"  # the app mounts the dashboard here: its links must say so
SIZES = (50, 2_000)  # executions holding pending entries


def seq_at(at: float, n: int) -> int:
    """A seq as the store mints one at `at` (node 5)."""
    return ((int(at * 1000) - EPOCH_MS) << MS_SHIFT) | (5 << SEQ_BITS) | (n & 0xFFF)


def holding(eid: str, born: float, *, emits: int, spawns: int, definition: str = "Order") -> dict[str, Any]:
    """A RUNNING execution exactly as the store writes it (its own commit plan), holding
    `emits` outbox entries and `spawns` spawns minted at `born` and the milliseconds after."""
    exe = Execution(
        id=eid, definition_id=definition, status=Status.RUNNING, active_path="Ship", created_at=born, updated_at=born
    )
    kids = tuple((f"{eid}:Ship:{k}", "Ship", {"k": k}) for k in range(spawns))
    request = CommitRequest(exe, [(None, Event(kind=f"E{k}")) for k in range(emits)], Event(kind="Go").id, spawns=kids)
    seqs = [seq_at(born + k / 1000, k) for k in range(emits + spawns)]
    plan = plan_commit(request, seqs=seqs, trace_max=20, dedupe_window=100)
    assert plan.insert is not None
    return {**plan.insert, "part": part_of(eid, DEFAULT_PARTITIONS)}


def population(start: int, stop: int, now: float) -> list[dict[str, Any]]:
    """Executions holding entries from 1 minute to 1 hour old, spread in no order; one in
    five also holds a spawn, one in seven only spawns."""
    out = []
    for i in range(start, stop):
        spread = i * 0.618_033_988_75 % 1
        emits, spawns = (0, 1) if i % 7 == 0 else (1 + i % 3, int(i % 5 == 0))
        out.append(holding(f"h{i:05d}", now - 60 - spread * (HOUR - 60), emits=emits, spawns=spawns))
    return out


def rows_match(rows: list[dict[str, Any]], truth: PendingTruth, kind: str, now: float, n: int = OLDEST) -> None:
    """The rows name exactly the truth's first `n` holders of `kind`, in order, with their
    definition, oldest entry's age (at the view's `now`) and number of entries."""
    want = truth.holders[kind][:n]
    assert [r["id"] for r in rows] == [eid for _, eid, _, _ in want], (kind, rows, want)
    for r, (seq, _, definition, held) in zip(rows, want):
        assert r["kind"] == kind and r["definition_id"] == definition and r["entries"] == held, r
        assert r["age"] == pytest.approx(age(seq, now), abs=1e-3), (r, seq)


def raw(coll: Any) -> list[dict[str, Any]]:
    return list(coll.find({}))


async def test_the_executions_holding_the_oldest_entries_are_named_in_every_view(
    mongo_url: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's execution (an outbox entry and a spawn pending for two hours) and one
    holding only an older spawn head their lists, among 300 holding younger entries, in
    the page (linked), its JSON (with the link, under the app's mount), `status`'s table
    and `status --json`; with a sample of the counts taken, the list is still read now."""
    monkeypatch.setattr(lowest_module, "_START", {})
    monkeypatch.setattr(lowest_module, "_KEPT", {})
    # the test takes its sample itself; the dashboard's own sampler would outlive the test
    # on the session's event loop, reading through whatever database the classes bind next
    monkeypatch.setattr(charts.Sampler, "start", lambda self, doc, samples: None)
    aclient: Any = pymongo.AsyncMongoClient(mongo_url)
    store = AsyncMongoStore(aclient, db_name)
    await store.init()
    coll = pymongo.MongoClient(mongo_url)[db_name].harel_executions
    now = time.time()
    coll.insert_many(population(0, 300, now))  # the bound is the next test's, at 2,000
    coll.insert_many(
        [
            holding("stalled order", now - 2 * HOUR, emits=1, spawns=1),  # the issue's, a space in its id
            holding("old-spawner", now - 3 * HOUR, emits=0, spawns=2, definition="Batch"),
        ]
    )
    app = FastAPI()
    app.include_router(dashboard_router(store, auth=no_auth, metrics=StoreMetrics(CollectorRegistry())), prefix=MOUNT)
    target = Target(url=mongo_url, db=db_name, prefix="harel", retry=RetryPolicy(1, 0.1, 5_000), source="--url")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http:
        for sampled in (False, True):
            if sampled:  # the counts from a sample a worker took 30 s ago: the list is read now
                await take_sample(ExecutionDocument, aclient[db_name].harel_hb_samples, now=time.time() - 30)
            answer = await http.get(f"{MOUNT}/api/backlog")
            assert answer.status_code == 200, answer.text[:300]
            body = answer.json()
            truth = pending_truth(raw(coll), body["now"])
            assert (body["entries_at"] < body["now"] - 20) is sampled, body["entries_at"]
            assert truth.oldest_ids("outbox", 1) == ["stalled order"]
            assert truth.oldest_ids("spawn", 2) == ["old-spawner", "stalled order"]
            for kind, rows in (("outbox", body["oldest_outbox"]), ("spawn", body["oldest_spawns"])):
                rows_match(rows, truth, kind, body["now"])
                assert [r["page"] for r in rows] == [f"{MOUNT}/execution?id={quote(r['id'], safe='')}" for r in rows]
            page = await http.get(f"{MOUNT}/backlog")
            assert page.status_code == 200
            table = page.text.split('id="oldest-pending"', 1)[1].split("</table>", 1)[0]
            linked = [html.unescape(h) for h in re.findall(r'href="([^"]+)"', table)]
            assert linked == [r["page"] for r in body["oldest_outbox"] + body["oldest_spawns"]], linked
            # each link opens that execution's page
            opened = await http.get(linked[0])
            assert opened.status_code == 200 and "stalled order" in opened.text
    # `status`, collected as the command does, then the command itself in a process of its own
    data = await status_command.collect(target, 300.0, 10)
    truth = pending_truth(raw(coll), data["now"])
    rows_match(data["oldest_outbox"], truth, "outbox", data["now"])
    rows_match(data["oldest_spawns"], truth, "spawn", data["now"])
    argv = ["status", "--url", mongo_url, "--db", db_name]
    proc = subprocess.run(
        [sys.executable, "-m", "harel_beanie", *argv, "--json"], env=cli_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-800:]
    said = json.loads(proc.stdout)
    truth = pending_truth(raw(coll), said["now"])
    rows_match(said["oldest_outbox"], truth, "outbox", said["now"])
    rows_match(said["oldest_spawns"], truth, "spawn", said["now"])
    assert said["oldest_outbox"][0]["page"] == "/execution?id=stalled%20order"
    text = subprocess.run(
        [sys.executable, "-m", "harel_beanie", *argv], env=cli_env(COLUMNS="200"), capture_output=True, text=True
    )
    assert text.returncode == 0, text.stderr[-800:]
    shown = text.stdout.split("Oldest pending entries, by execution", 1)[1]
    for row in said["oldest_outbox"] + said["oldest_spawns"]:
        assert row["id"] in shown and row["page"] in shown, (row, shown)
    assert "2.0h old" in shown and "3.0h old" in shown, shown
    await store.close()


class _Finds(pymongo.monitoring.CommandListener):
    """Every find sent to the executions, as sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def started(self, event: pymongo.monitoring.CommandStartedEvent) -> None:
        if event.command_name == "find" and event.command.get("find") == "harel_executions":
            keep = ("find", "filter", "sort", "limit", "projection")
            self.sent.append({k: event.command[k] for k in keep if k in event.command})

    def succeeded(self, event: Any) -> None:
        pass

    def failed(self, event: Any) -> None:
        pass


async def test_the_list_reads_about_n_documents_however_many_hold_entries(
    mongo_url: str, db_name: str, client: pymongo.MongoClient[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 50, then 2,000 executions holding entries: the list's reads examine about N
    documents per kind on the server's own account, through the list's own indexes, and
    their filters match as few, the same at both sizes; the rows are the documents' first
    N. (A process's very first read of a kind, with no start kept anywhere, reads its
    matches once: `queries.lowest`; the reads counted are the next ones, as a view's are.)"""
    monkeypatch.setattr(lowest_module, "_START", {})
    monkeypatch.setattr(lowest_module, "_KEPT", {})
    finds = _Finds()
    aclient: Any = pymongo.AsyncMongoClient(mongo_url, event_listeners=[finds])
    store = AsyncMongoStore(aclient, db_name)
    await store.init()
    coll = client[db_name].harel_executions
    db = client[db_name]
    now = time.time()
    work: dict[int, tuple[int, int]] = {}
    made = 0
    for size in SIZES:
        coll.insert_many(population(made, size, now))
        made = size
        for _ in range(3):  # the windows are sized from the last read's
            await oldest_holders(ExecutionDocument, OLDEST, now)
        finds.sent.clear()
        listed = await oldest_holders(ExecutionDocument, OLDEST, now)
        truth = pending_truth(raw(coll), now)
        rows_match(listed["outbox"], truth, "outbox", now)
        rows_match(listed["spawn"], truth, "spawn", now)
        examined = matched = 0
        for find in finds.sent:
            plan = db.command("explain", find, verbosity="executionStats")
            stats = plan["executionStats"]
            examined += int(stats["totalDocsExamined"])
            matched += coll.count_documents(find["filter"])
            assert _index_of(plan) in ("hb_outbox_oldest", "hb_spawn_oldest"), plan["queryPlanner"]
        work[size] = (examined, matched)
        assert truth.counts["outbox"] > size  # every one of them holds entries
    await store.close()
    (small_docs, small_match), (large_docs, large_match) = work[SIZES[0]], work[SIZES[-1]]
    # 40 times the executions holding entries: about the same documents, about N a kind
    assert large_docs <= small_docs + 10 and large_docs <= 6 * OLDEST, work
    assert large_match <= small_match + 10 and large_match <= 6 * OLDEST, work


def _index_of(plan: dict[str, Any]) -> Optional[str]:
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("stage") in ("IXSCAN", "EXPRESS_IXSCAN"):
                found.append(node.get("indexName"))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(plan["queryPlanner"]["winningPlan"])
    return found[0] if found else None


async def test_a_database_in_harels_layout_lists_them_from_its_one_pass(
    mongo_url: str, db_name: str, client: pymongo.MongoClient[Any]
) -> None:
    """Before `migrate up` (no layout recorded, no `pending` flag) the backlog reads every
    document anyway; the list comes from that pass, the same as the documents say."""
    coll = client[db_name].harel_executions
    now = time.time()
    docs = population(0, 40, now)
    for d in docs:
        d.pop("pending", None)
    coll.insert_many(docs)
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db_name, create_schema=False)
    await store.init()
    b = await queries.backlog(now=now, oldest=3)
    truth = pending_truth(raw(coll), now)
    rows_match(b.oldest_outbox, truth, "outbox", now, n=3)
    rows_match(b.oldest_spawns, truth, "spawn", now, n=3)
    await store.close()
