"""Every view reads every document the store can hold (tests/support/seeds.py: tombstones, executions
harel's own store wrote, a definition no registry knows, hostile ids, the largest allowed
execution): the typed queries, `harel-beanie status`, `/metrics` and every dashboard page in
HTML and JSON, on the real server. Before, one purge was enough for the listing and the
backlog to raise (a tombstone has no `definition_id`), and so for every page, `status` and
`/metrics` after it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from html import unescape
from typing import Any

import httpx
import pymongo
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from harel_beanie import AsyncMongoStore, queries
from harel_beanie.dashboard import dashboard_router, no_auth
from harel_beanie.telemetry.metrics import StoreMetrics
from tests.support.seeds import HOSTILE_IDS, Seeded, seed_everything, seed_harel_layout


@pytest.fixture
async def seeded(astore: Any, mongo_url: str, db_name: str) -> Seeded:
    return await seed_everything(astore, mongo_url, db_name)


async def _all_pages(flt: queries.ExecutionFilter, limit: int) -> list[queries.ExecutionRow]:
    rows: list[queries.ExecutionRow] = []
    after = None
    while True:
        page = await queries.executions_page(flt, after=after, limit=limit)
        rows += page.rows
        if page.next_after is None:
            return rows
        after = page.next_after


async def test_the_queries_read_every_document(astore: Any, seeded: Seeded) -> None:
    """Paging through everything (no filter, roots only) lists every execution once, never a
    tombstone, with the status harel's store kept inside the snapshot of the documents it
    wrote; the detail of each execution reads; a purged id reads as purged."""
    everything = await _all_pages(queries.ExecutionFilter(), limit=7)
    assert sorted(r.id for r in everything) == sorted(seeded.executions)
    assert {r.id: r.status for r in everything} == {i: e["status"] for i, e in seeded.executions.items()}
    roots = await _all_pages(queries.ExecutionFilter(roots_only=True), limit=5)
    assert {r.id for r in roots} == {r.id for r in everything if r.parent_id is None}
    assert not set(seeded.purged) & {r.id for r in roots}
    for execution_id, expected in seeded.executions.items():
        detail = await queries.execution_detail(execution_id)
        assert detail is not None and detail.id == execution_id, execution_id
        assert (detail.definition_id, detail.status) == (expected["definition_id"], expected["status"])
    for execution_id in seeded.purged:
        assert await queries.execution_detail(execution_id) is None
        tomb = await queries.purged(execution_id)
        assert tomb is not None and tomb.at > 0
    counts = await queries.status_counts(queries.ExecutionFilter())
    assert sum(counts.values()) == len(seeded.executions)
    b = await queries.backlog(show=50)
    assert b.purged == len(seeded.purged) and seeded.unknown_definition in b.counts
    assert b.pending_outbox == 1 and b.pending_spawns == 1 and b.due_timers == 1


async def test_status_and_metrics_read_every_document(
    astore: Any, seeded: Seeded, mongo_url: str, db_name: str
) -> None:
    """`harel-beanie status` (tables and --json) and the Prometheus figures, over the same
    database: the tombstones counted as purged, every definition listed."""
    args = ["status", "--url", mongo_url, "--db", db_name, "--show", "100"]
    code, out = await _cli(args + ["--json"])
    assert code == 0, out
    data = json.loads(out)
    assert data["purged"] == len(seeded.purged) and data["executions"] == len(seeded.executions)
    code, shown = await _cli(args)
    assert code == 0, shown
    assert "purged execution id(s)" in shown and seeded.unknown_definition in shown
    metrics = StoreMetrics(CollectorRegistry())
    await metrics.refresh()
    text = metrics.render().decode()
    assert re.search(r"^harel_executions_purged 2\.0$", text, re.M)
    assert f'definition="{seeded.unknown_definition}"' in text


async def _cli(argv: list[str]) -> tuple[int, str]:
    """The real command line, in a process of its own: exit code and standard output."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "harel_beanie",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


def _hrefs(html: str, path: str) -> list[str]:
    return [unescape(h) for h in re.findall(r'href="([^"]*)"', html) if unescape(h).split("?")[0].endswith(path)]


async def test_every_dashboard_page_reads_every_document(astore: Any, seeded: Seeded) -> None:
    """Every page and its JSON twin answers 200 over that database; every execution listed on
    the list page is linked, and its link opens exactly that execution, in HTML and JSON
    (ids holding `/`, `?`, `#`, `%`, `..`, quotes, markup, NUL, nothing at all)."""
    app = FastAPI()
    app.include_router(dashboard_router(astore, auth=no_auth, metrics=StoreMetrics(CollectorRegistry())), prefix="/ops")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        for path in (
            "/ops/",
            "/ops/?roots=true",
            "/ops/failed",
            "/ops/backlog",
            "/ops/api/executions",
            "/ops/api/executions?roots=true",
            "/ops/api/failed",
            "/ops/api/backlog",
            "/ops/metrics",
        ):
            r = await http.get(path)
            assert r.status_code == 200, (path, r.text[:300])
        listing = (await http.get("/ops/", params={"limit": "500"})).text
        links = _hrefs(listing, "/ops/execution")
        opened: set[str] = set()
        for link in links:
            r = await http.get(link)
            assert r.status_code == 200, (link, r.text[:200])
            as_json = await http.get(link.replace("/ops/execution?", "/ops/api/execution?"))
            assert as_json.status_code == 200
            execution_id = as_json.json()["execution"]["id"]
            shown = re.search(r'<span class="mono" id="execution-id"[^>]*>(.*?)</span>', r.text, re.S)
            assert shown and unescape(shown.group(1)) == execution_id, (link, execution_id)
            opened.add(execution_id)
        assert opened == set(seeded.executions)
        assert set(HOSTILE_IDS) <= opened
        for execution_id in seeded.purged:
            r = await http.get("/ops/api/execution", params={"id": execution_id})
            assert r.status_code == 404 and "purged at" in r.json()["detail"]


async def test_every_view_reads_a_database_harels_store_wrote(mongo_url: str, db_name: str) -> None:
    """A database written by harel's own MongoStore, before `migrate up` (no summary fields,
    no `pending` flag, no timer bound): the listing shows each execution with the status its
    snapshot holds, the backlog counts its statuses, pending entries and due timers, and
    `status`, `/metrics` and every page answer with the same figures."""
    written = seed_harel_layout(mongo_url, db_name)
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db_name, create_schema=False)
    try:
        await store.init()
        assert store._state.compat  # the store's own compatibility mode
        rows = await _all_pages(queries.ExecutionFilter(), limit=2)
        assert {r.id: r.status for r in rows} == {i: e["status"] for i, e in written.items()}
        detail = await queries.execution_detail("legacy/2")
        assert detail is not None and detail.status == "FAILED" and detail.spawns
        b = await queries.backlog(show=10)
        assert b.counts["Order"] == {"SUSPENDED": 1, "DONE": 1, "RUNNING": 1} and b.counts["Legacy"] == {"FAILED": 1}
        assert (b.pending_outbox, b.pending_spawns, b.due_timers, len(b.next_timers)) == (1, 1, 1, 2)
        assert {t["path"] for t in b.next_timers} == {"Waiting.Nudge", "Late"}
        code, out = await _cli(["status", "--url", mongo_url, "--db", db_name, "--json"])
        assert code == 0 and json.loads(out)["totals"] == {"SUSPENDED": 1, "DONE": 1, "RUNNING": 2, "FAILED": 1}
        app = FastAPI()
        app.include_router(dashboard_router(store, auth=no_auth, metrics=StoreMetrics(CollectorRegistry())))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            for path in ("/", "/failed", "/backlog", "/api/executions", "/api/failed", "/api/backlog", "/metrics"):
                r = await http.get(path)
                assert r.status_code == 200, (path, r.text[:300])
            assert re.search(r'^harel_pending_entries\{kind="outbox"\} 1\.0$', r.text, re.M)
            for link in _hrefs((await http.get("/")).text, "/execution"):
                assert (await http.get(link)).status_code == 200, link
            r = await http.get("/api/execution", params={"id": "legacy-1"})
            assert r.json()["execution"]["status"] == "SUSPENDED" and len(r.json()["timers"]) == 2
    finally:
        await store.close()
