"""The scale benchmark's operator-side measurements: every dashboard route as a browser or a
scraper asks for it (the real `harel-beanie dashboard` command, a child process, over HTTP),
`harel-beanie status` (the real command line), the first page of each listing and search
through the typed queries API (`harel_beanie.queries`), as an application embedding them
calls it, and the documents the backlog, the failed page and `/metrics` read."""

from __future__ import annotations

import asyncio
import datetime
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import httpx
import pymongo
from pymongo import monitoring

from bench.scale.store import median_ms
from harel_beanie import AsyncMongoStore
from harel_beanie.deploy.embedded import free_port
from harel_beanie.queries import ExecutionFilter, executions_page, status_counts

CLI = [sys.executable, "-m", "harel_beanie"]  # the command line, as `harel-beanie` runs it
EXECUTIONS = "harel_executions"


def routes(prefix: str, parent: str, one: str, now: float) -> dict[str, str]:
    """Every page and API route of the dashboard, as the benchmark asks for it."""
    day = datetime.timedelta(days=1)
    at = datetime.datetime.fromtimestamp(now, datetime.timezone.utc) - 10 * day
    span = f"from={at:%Y-%m-%dT%H:%M}&to={at + day:%Y-%m-%dT%H:%M}"
    return {
        "GET / (front page)": "/",
        "GET /?status=FAILED": "/?status=FAILED",
        "GET /?definition=Order": "/?definition=Order",
        f"GET /?prefix= ({len(prefix)} chars)": f"/?prefix={prefix}",
        "GET /?from=&to= (one day)": f"/?{span}",
        "GET /?parent= (children)": f"/?parent={parent}",
        "GET /api/executions?status=FAILED": "/api/executions?status=FAILED",
        "GET /api/executions?prefix=": f"/api/executions?prefix={prefix}",
        "GET /execution?id=": f"/execution?id={one}",
        "GET /api/execution?id=": f"/api/execution?id={one}",
        "GET /failed": "/failed",
        "GET /backlog": "/backlog",
        "GET /api/charts": "/api/charts",
        "GET /metrics": "/metrics",
    }


class Dashboard:
    """`harel-beanie dashboard` on a free port, as a context manager."""

    def __init__(self, url: str, db: str, timeout: float) -> None:
        self.token = secrets.token_urlsafe(16)
        self.port = free_port()
        # `--token=`: one in 64 tokens starts with "-", which argparse would take for an option
        argv = [*CLI, "dashboard", "--url", url, "--db", db, "--port", str(self.port), f"--token={self.token}"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=timeout,
        )

    def __enter__(self) -> "Dashboard":
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the dashboard exited: {self.proc.stderr.read().decode()[-2000:] if self.proc.stderr else ''}"
                )
            try:
                self.client.get("/static/none")
                return self
            except httpx.TransportError:
                time.sleep(0.2)
        raise TimeoutError("the dashboard did not answer within 60 s")

    def __exit__(self, *exc: Any) -> None:
        self.client.close()
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def get(self, path: str) -> None:
        r = self.client.get(path)
        if r.status_code != 200:
            raise RuntimeError(f"GET {path}: {r.status_code} {r.text[:300]}")


FIRST_VIEW = "GET / (the first view after the dashboard starts)"


def dashboard_ms(
    url: str, db: str, paths: dict[str, str], reps: int, budget: float, timeout: float, say: Callable[[str], None]
) -> dict[str, float]:
    """Median ms of each route once it has been asked for once (NaN: a request took longer
    than `timeout` seconds; the dashboard is then started again, though the server may still
    be busy with that request), and the front page's first view in a new dashboard process
    on its own: that one reads where its listing starts, the rest start where it did."""
    out: dict[str, float] = {}
    dash = Dashboard(url, db, timeout).__enter__()
    try:
        for name, path in paths.items():
            try:
                started = time.perf_counter()
                dash.get(path)  # the first in this process, on its own
                if path == "/":
                    out[FIRST_VIEW] = 1000 * (time.perf_counter() - started)
                    say(f"  {FIRST_VIEW}: {out[FIRST_VIEW]:,.1f} ms")
                out[name] = median_ms(lambda p: dash.get(p), reps, budget, lambda i: path)[0]
            except httpx.TimeoutException:
                out[name] = float("nan")
                dash.__exit__()
                dash = Dashboard(url, db, timeout).__enter__()
            say(f"  {name}: {out[name]:,.1f} ms")
    finally:
        dash.__exit__()
    return out


SAMPLE = "per-minute sample (taken by a worker or the dashboard, off the request path)"


def sample_ms(url: str, db: str) -> float:
    """The ms of taking this minute's sample of the store, as a running worker or dashboard
    takes one a minute (`queries.samples`): `status`, `/backlog` and `/metrics` take the
    pending entries from it, so the views measured next have one, as in a running stack.
    Taken again if this minute has one already (the dashboard's own)."""
    return asyncio.run(_sample_ms(url, db))


async def _sample_ms(url: str, db: str) -> float:
    from harel_beanie.core.documents import ExecutionDocument
    from harel_beanie.queries.samples import MINUTE, samples_name, take_sample

    client: Any = pymongo.AsyncMongoClient(url)
    store = AsyncMongoStore(client, db, create_schema=False)
    await store.init()
    try:
        samples = client[db][samples_name("harel")]
        now = time.time()
        await samples.delete_one({"_id": now - now % MINUTE})
        started = time.perf_counter()
        await take_sample(ExecutionDocument, samples, now=now)
        return 1000 * (time.perf_counter() - started)
    finally:
        await store.close()


def status_ms(url: str, db: str, reps: int, budget: float, timeout: float) -> float:
    """Median ms of `harel-beanie status --json`, the command line as an operator runs it
    (a sample at most a minute old kept, as while a worker or a dashboard runs: `sample_ms`)."""
    argv = [*CLI, "status", "--url", url, "--db", db, "--json"]

    def once(i: int) -> None:
        subprocess.run(argv, check=True, capture_output=True, timeout=timeout)

    try:
        return median_ms(once, reps, budget)[0]
    except subprocess.TimeoutExpired:
        return float("nan")


# --- the queries API -------------------------------------------------------------------------


def searches(prefix: str, parent: str, now: float) -> dict[str, ExecutionFilter]:
    """The listing and each search, as filters of the queries API."""
    day = 86_400.0
    return {
        "queries: first page, no filter": ExecutionFilter(),
        "queries: first page, status FAILED": ExecutionFilter(status="FAILED"),
        "queries: first page, definition Order": ExecutionFilter(definition_id="Order"),
        "queries: first page, id prefix": ExecutionFilter(id_prefix=prefix),
        "queries: first page, updated in one day": ExecutionFilter(
            updated_after=now - 10 * day, updated_before=now - 9 * day
        ),
        "queries: first page, roots only": ExecutionFilter(roots_only=True),
        "queries: children of one execution": ExecutionFilter(parent_id=parent),
    }


def queries_ms(
    url: str, db: str, filters: dict[str, ExecutionFilter], reps: int, budget: float, timeout: float
) -> dict[str, float]:
    """Median ms of each search's first page of 50, and of `status_counts()` (NaN: a call took
    longer than `timeout` seconds)."""
    return asyncio.run(_queries(url, db, filters, reps, budget, timeout))


async def _queries(
    url: str, db: str, filters: dict[str, ExecutionFilter], reps: int, budget: float, timeout: float
) -> dict[str, float]:
    store = await AsyncMongoStore.from_url(url, db, create_schema=False)
    await store.init()  # binds the Beanie classes the queries read
    out: dict[str, float] = {}

    def first_page(flt: ExecutionFilter) -> Callable[[], Any]:
        return lambda: executions_page(flt, limit=50)

    try:
        jobs = {name: first_page(f) for name, f in filters.items()}
        jobs["queries: `status_counts()`"] = lambda: status_counts()
        for name, job in jobs.items():
            try:
                out[name] = await asyncio.wait_for(_median_async(job, reps, budget), timeout)
            except asyncio.TimeoutError:
                out[name] = float("nan")
    finally:
        await store.close()
    return out


async def _median_async(job: Callable[[], Any], reps: int, budget: float) -> float:
    times: list[float] = []
    t0 = time.perf_counter()
    await job()  # warm-up
    warm = time.perf_counter() - t0
    if warm > budget:
        return 1000 * warm
    start = time.perf_counter()
    for _ in range(reps):
        t = time.perf_counter()
        await job()
        times.append(time.perf_counter() - t)
        if time.perf_counter() - start > budget:
            break
    times.sort()
    return 1000 * times[len(times) // 2]


def rss_mb(pid: Optional[int]) -> Optional[tuple[float, float]]:
    """(resident, peak resident) MB of process `pid` and its children's, from /proc; None when
    the server is not a process of this machine."""
    if pid is None:
        return None
    try:
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
    except OSError:
        return None

    def mb(key: str) -> float:
        return float(fields.get(key, "0 kB").split()[0]) / 1024

    return mb("VmRSS"), mb("VmHWM")


# --- what the operator's views read ------------------------------------------------------------


class _Reads(monitoring.CommandListener):
    """The filter of every read sent to the executions (a find's, an aggregate's first
    `$match`): what the embedded server reads for it is the documents it matches."""

    def __init__(self) -> None:
        self.filters: list[dict[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        cmd = event.command
        if event.command_name == "find" and cmd["find"] == EXECUTIONS:
            self.filters.append(dict(cmd.get("filter") or {}))
        elif event.command_name == "aggregate" and cmd["aggregate"] == EXECUTIONS:
            self.filters.append(dict(((cmd.get("pipeline") or [{}])[0]).get("$match") or {}))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


#: the views whose reads are counted, as each calls the queries (status: `backlog()` with its
#: default `--show`), each with the pending entries from a sample at most a minute old
#: (`sample_ms`), as while a worker or a dashboard runs
VIEWS_READ = ("`harel-beanie status` / `GET /backlog`: `backlog()`", "`GET /failed`", "`GET /metrics`")


def views_read(url: str, db: str) -> dict[str, int]:
    """The documents each view's reads match (each view read twice first, as a running
    dashboard has): the structural figure behind its time, counted as
    tests/queries/test_stuck.py counts it."""
    return asyncio.run(_views_read(url, db))


async def _views_read(url: str, db: str) -> dict[str, int]:
    from harel_beanie.core.documents import ExecutionDocument
    from harel_beanie.dashboard import views
    from harel_beanie.queries.samples import latest_sample, sampled_backlog, samples_name, take_sample
    from harel_beanie.telemetry.metrics import StoreMetrics, new_registry

    reads = _Reads()
    client: Any = pymongo.AsyncMongoClient(url, event_listeners=[reads])
    store = AsyncMongoStore(client, db, create_schema=False)
    await store.init()
    samples = client[db][samples_name("harel")]
    if await latest_sample(samples) is None:
        await take_sample(ExecutionDocument, samples)

    async def scrape() -> Any:
        return await metrics.refresh(sampled=await latest_sample(samples))

    counter: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    metrics = StoreMetrics(new_registry())
    jobs = dict(
        zip(
            VIEWS_READ,
            (
                lambda: sampled_backlog(ExecutionDocument, samples, show=10),
                lambda: views.failed_view(after=None, limit=50, stuck_after=300.0, doc=ExecutionDocument),
                scrape,
            ),
        )
    )
    out = {}
    try:
        for name, job in jobs.items():
            for _ in range(2):
                await job()
            reads.filters.clear()
            await job()
            out[name] = sum(counter[db][EXECUTIONS].count_documents(f) for f in reads.filters)
    finally:
        await store.close()
        counter.close()
    return out
