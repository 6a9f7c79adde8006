"""The counts every reader shows, against a count of the documents themselves: what a run
that stored executions ends with.

Why this module exists. The counts are state kept beside the executions (counters folded
from dirty documents, `harel_beanie.core.counting`), and three places show them: the store's
queries (`status_counts()`, `execution_counts()`), the dashboard (its JSON and `/metrics`) and
`harel-beanie status --json`. A run that kills, freezes and cuts off processes in the middle
of commits, folds and purges is where a count goes wrong for good, so each multi-process
reliability run ends here, once the work has drained and its workers have stopped:
`exact_counts` reads every source, counts the documents with plain aggregations (executions
by definition and status, tombstones), and names every difference. It
does so twice: as the run left the counters, and again after a fold of every partition
(which must change nothing a reader sees). At both moments it also holds the stuck list and
the pending figures of every view to their definitions (`tests/support/exact_waiting.py`),
from the same answers of the dashboard and the status command.

The comparison is written once, here; the runs call it (tests/support/netfaults/run.py for the
network and partition runs, tests/reliability/test_reliability_crash.py for the crash runs),
and tests/queries/test_exact_counts.py shows it failing on a counter moved by hand.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

import pymongo
from harel.engine.schema import Names

from tests.support.exact_waiting import SHOW, STUCK_AFTER, Waiting

#: where the `harel-beanie status` process may take this long (a loaded 2-core machine)
STATUS_TIMEOUT = 120.0


@dataclass
class Tally:
    """What one source says: executions per status (`totals`), per definition where it
    says so (`per`), and tombstones where it says them (None: it does not)."""

    totals: dict[str, int]
    per: Optional[dict[str, dict[str, int]]] = None
    purged: Optional[int] = None
    #: the source's whole answer where the stuck and pending check reads it too
    #: (`tests.support.exact_waiting`): not part of the counts compared
    said: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, per: dict[str, dict[str, int]], **more: Any) -> "Tally":
        """From counts per definition (zero counts dropped), totals summed from them."""
        kept = {d: {s: n for s, n in ss.items() if n} for d, ss in per.items()}
        kept = {d: ss for d, ss in kept.items() if ss}
        totals: dict[str, int] = {}
        for ss in kept.values():
            for s, n in ss.items():
                totals[s] = totals.get(s, 0) + n
        return cls(totals=totals, per=kept, **more)


@dataclass
class CountCheck:
    """The documents' own count, what each source said, and every difference."""

    documents: Tally
    sources: dict[str, Tally] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        return {
            "counted_executions": sum(self.documents.totals.values()),
            "counted_tombstones": self.documents.purged,
            "count_sources": len(self.sources),
            "count_differences": len(self.problems),
        }


async def count_documents(url: str, db: str, prefix: str) -> tuple[Tally, list[str]]:
    """The independent count: plain aggregations over the executions collection, on a
    client of its own. Also what no run should end with: a document prune began removing."""
    client: Any = pymongo.AsyncMongoClient(url)
    try:
        coll = client[db][Names(prefix).executions]
        by = {"_id": {"d": "$definition_id", "s": "$status"}, "n": {"$sum": 1}}
        groups = await (await coll.aggregate([{"$match": {"tomb": {"$exists": False}}}, {"$group": by}])).to_list(None)
        tombs = await (
            await coll.aggregate([{"$match": {"tomb": {"$exists": True}}}, {"$group": {"_id": None, "n": {"$sum": 1}}}])
        ).to_list(None)
        leaving = await coll.count_documents({"leaving": True})
    finally:
        await client.close()
    per: dict[str, dict[str, int]] = {}
    for g in groups:
        ss = per.setdefault(str(g["_id"].get("d")), {})
        ss[str(g["_id"].get("s"))] = int(g["n"])
    odd = [f"{leaving} document(s) still marked leaving: a prune began removing them and never finished"]
    return Tally.of(per, purged=int(tombs[0]["n"]) if tombs else 0), odd if leaving else []


async def store_says(store: Any) -> dict[str, Tally]:
    """`status_counts()` (in all and per definition) and `execution_counts()`, through the
    store's own Beanie classes (the store must be initialised)."""
    from harel_beanie import queries
    from harel_beanie.core.documents import bind

    doc = bind(store.settings.prefix)[0]
    counted = await queries.execution_counts(doc=doc)
    out: dict[str, Tally] = {}
    if counted is not None:
        out["execution_counts()"] = Tally.of(counted.per, purged=counted.purged)
        definitions = sorted(counted.per)
    else:
        definitions = []
    per = {d: await queries.status_counts(queries.ExecutionFilter(definition_id=d), doc=doc) for d in definitions}
    out["status_counts()"] = Tally(totals=dict(await queries.status_counts(doc=doc)), per=_kept(per))
    return out


async def dashboard_says(store: Any) -> dict[str, Tally]:
    """The dashboard's numbers, through its routes in an app of this process: `/api/backlog`
    (per definition and status), `/api/executions` (per status, in all and for each
    definition it lists), `/metrics` (the gauges, tombstones included)."""
    import httpx
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry
    from prometheus_client.parser import text_string_to_metric_families

    from harel_beanie.dashboard import dashboard_router, no_auth
    from harel_beanie.telemetry.metrics import StoreMetrics

    app = FastAPI()
    router = dashboard_router(store, auth=no_auth, metrics=StoreMetrics(CollectorRegistry()), stuck_after=STUCK_AFTER)
    app.include_router(router)
    out: dict[str, Tally] = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dashboard") as http:
        backlog = (await _get(http, "/api/backlog")).json()
        out["dashboard /api/backlog"] = Tally(
            totals=dict(backlog["totals"]), per=_kept(backlog["counts"]), said=backlog
        )
        listed = (await _get(http, "/api/executions")).json()
        per = {}
        for d in listed["definitions"]:
            per[d] = (await _get(http, "/api/executions", params={"definition": d})).json()["counts"]
        out["dashboard /api/executions"] = Tally(totals=dict(listed["counts"]), per=_kept(per))
        gauges: dict[str, dict[str, int]] = {}
        purged = None
        scraped = (await _get(http, "/metrics")).text
        for family in text_string_to_metric_families(scraped):
            for sample in family.samples:
                if sample.name == "harel_executions":
                    ss = gauges.setdefault(sample.labels["definition"], {})
                    ss[sample.labels["status"]] = int(sample.value)
                elif sample.name == "harel_executions_purged":
                    purged = int(sample.value)
        out["dashboard /metrics"] = Tally.of(gauges, purged=purged, said=scraped)
    return out


async def _get(http: Any, path: str, **kwargs: Any) -> Any:
    answer = await http.get(path, **kwargs)
    if answer.status_code != 200:
        raise AssertionError(f"the dashboard answered {answer.status_code} to {path}: {answer.text[:300]}")
    return answer


async def status_says(url: str, db: str, prefix: str) -> dict[str, Tally]:
    """`harel-beanie status --json`, the real command in a process of its own (with the end
    check's stuck threshold, every stuck execution listed: `tests.support.exact_waiting`)."""
    argv = [sys.executable, "-m", "harel_beanie", "status", "--url", url, "--db", db, "--prefix", prefix, "--json"]
    argv += ["--stuck-after", str(STUCK_AFTER), "--show", str(SHOW)]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=STATUS_TIMEOUT)
    if proc.returncode != 0:
        raise AssertionError(f"harel-beanie status exited {proc.returncode}: {err.decode(errors='replace')[-500:]}")
    said = json.loads(out)
    if sum(said["totals"].values()) != said["executions"]:
        raise AssertionError(f"harel-beanie status: totals {said['totals']} but executions {said['executions']}")
    tally = Tally(totals=dict(said["totals"]), per=_kept(said["counts"]), purged=said["purged"], said=said)
    return {"harel-beanie status --json": tally}


def _kept(per: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return Tally.of(per).per or {}


def compare(documents: Tally, sources: dict[str, Tally], when: str) -> list[str]:
    """One line per figure a source gives that is not the documents'."""
    problems = []
    for name, said in sources.items():
        if said.totals != documents.totals:
            problems.append(f"{when}: {name} says {said.totals} per status, the documents {documents.totals}")
        if said.per is not None and said.per != documents.per:
            problems.append(f"{when}: {name} says {said.per} per definition, the documents {documents.per}")
        if said.purged is not None and said.purged != documents.purged:
            problems.append(f"{when}: {name} says {said.purged} tombstones, the documents {documents.purged}")
    return problems


async def exact_counts(store: Any, url: str) -> CountCheck:
    """Every source against the documents of `store`'s database and prefix (`url` reaches
    the same server: for the independent count and the status command), as they are, then
    again after a fold of every partition. A source that fails to answer is a problem too;
    so is a run that stored nothing, whose comparison would prove nothing. Call it once the
    run's writers have stopped: a write between two reads is a difference."""
    db, prefix = store.settings.db_name, store.settings.prefix
    documents, problems = await count_documents(url, db, prefix)
    if not documents.totals:
        problems.append("no execution stored: comparing counts would prove nothing")
    check = CountCheck(documents, problems=problems)
    for when in ("as the run left them", "after a fold of every partition"):
        if when != "as the run left them":
            await store.fold_counts(list(range(store.partitions.parts)))
        # the stuck list and the pending figures, held to their definitions (exact_waiting)
        waiting = await Waiting.begin(store, url)
        sources: dict[str, Tally] = {}
        for name, read in (
            ("the store", lambda: store_says(store)),
            ("the dashboard", lambda: dashboard_says(store)),
            ("harel-beanie status", lambda: status_says(url, db, prefix)),
        ):
            try:
                sources.update(await read())
            except Exception as exc:  # a source that cannot answer is a failed check, named
                check.problems.append(f"{when}: {name} failed: {type(exc).__name__}: {exc}")
        check.sources = sources
        check.problems += compare(documents, sources, when)
        check.problems += await waiting.end(store, {name: tally.said for name, tally in sources.items()}, when)
    again, _ = await count_documents(url, db, prefix)
    if again != documents:
        check.problems.append(f"the documents changed during the check: {documents} then {again}")
    return check
