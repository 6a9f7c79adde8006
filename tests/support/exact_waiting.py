"""The stuck list and the pending figures every view shows, against the documented definitions
computed from the raw documents: the other half of what a multi-process run ends with.

Why this module exists. `exact_counts` holds the counts to a count of the documents; the
figures an operator acts on beside them (which executions are stuck, how many outbox entries
and spawns are pending, how old the oldest is, which executions hold the oldest) are read
through other candidates (the `quiet` index, the timer bound, the unfolded documents, the
per-minute sample, the oldest-holders walk) and can go wrong apart from the counts. So each
run's end check (`exact_counts`, at both of its moments) also runs `Waiting`: it reads the
raw documents, takes a fresh per-minute sample (the writers have stopped: a sample taken
during the run may be up to a minute behind the documents, as documented, and would be
served), then holds every view to `tests/support/stuck_oracle.py` and
`tests/support/pending_oracle.py`, both written apart from the code that shows the figures:

- `queries.backlog` (read here), `harel-beanie status --json` and the dashboard's
  `/api/backlog` (read by `exact_counts`, their answers kept on its tallies): the stuck ids,
  the pending counts, the oldest ages, the ids holding the oldest entries of each kind;
- `/metrics`: `harel_executions_silent`, `harel_pending_entries`,
  `harel_pending_oldest_age_seconds`, and `harel_pending_sample_age_seconds` (a sample was
  just taken, so one is served: finite, no older than the check).

The documents must not change during the check (a difference is named). Time passes,
though: with the documents unchanged, the stuck set only grows (silence and overdue time
grow), so a view read between the check's first moment `t0` and its last `t1` lists a set
between the definition's at `t0` and at `t1` (the first `limit` of it where a view shows at
most `limit`), and an age lies between the oldest entry's age at the sample and at `t1`.
The threshold is `STUCK_AFTER`, a second, so a settled run's quiet executions are listed.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import pymongo
from harel.engine.schema import Names

from tests.support.pending_oracle import KINDS, PendingTruth, pending_truth
from tests.support.stuck_oracle import stuck_by_definition

#: the stuck threshold of every view the end check reads (seconds)
STUCK_AFTER = 1.0
#: the most stuck rows asked of a view that takes a bound (`backlog(show=...)`, `status --show`)
SHOW = 10_000
#: what the dashboard lists (its backlog page shows 20) and counts (`/metrics`, up to 1000)
DASHBOARD_SHOWS = 20
METRICS_COUNTS = 1000
#: how many holders of each kind a view lists (`queries.oldest.OLDEST`)
OLDEST = 5
#: the message every difference starts with
WAITING_MISMATCH = "stuck or pending"
#: seconds an age may differ by beyond the check's own duration (float rounding)
SLACK = 1e-3


@dataclass
class Seen:
    """What one view said: the stuck ids (and how many it lists at most), the pending counts
    and oldest ages per kind ("outbox", "spawn"), and the holders of the oldest entries
    (None where the view does not list them)."""

    stuck: Optional[list[str]] = None
    limit: Optional[int] = None
    stuck_count: Optional[int] = None  # a view that only counts them
    pending: dict[str, int] = field(default_factory=dict)
    ages: dict[str, Optional[float]] = field(default_factory=dict)
    holders: Optional[dict[str, list[str]]] = None


async def raw_documents(url: str, db: str, prefix: str) -> list[dict[str, Any]]:
    """Every document of the executions collection, on a client of its own."""
    client: Any = pymongo.AsyncMongoClient(url)
    try:
        return await client[db][Names(prefix).executions].find({}).sort("_id", 1).to_list(None)
    finally:
        await client.close()


@dataclass
class Waiting:
    """One end check: begun before the views are read (`begin`), ended after (`end`)."""

    url: str
    db: str
    prefix: str
    docs: list[dict[str, Any]]
    sampled_at: float
    t0: float

    @classmethod
    async def begin(cls, store: Any, url: str) -> "Waiting":
        """The documents as the run left them, and a sample of them taken now in place of
        any this minute already holds (`queries.samples`)."""
        from harel_beanie.core.documents import bind
        from harel_beanie.queries.samples import MINUTE, samples_name, take_sample

        db, prefix = store.settings.db_name, store.settings.prefix
        doc = bind(prefix)[0]
        docs = await raw_documents(url, db, prefix)
        samples = doc.get_pymongo_collection().database[samples_name(prefix)]
        at = time.time()
        # this minute's and any later one's (a worker's clock ahead): the fresh one is the newest
        await samples.delete_many({"_id": {"$gte": at - at % MINUTE}})
        await take_sample(doc, samples, now=at)
        return cls(url, db, prefix, docs, at, time.time())

    async def end(self, store: Any, answers: dict[str, Any], when: str) -> list[str]:
        """Every view against the definitions: `queries.backlog` read now, and the answers
        `exact_counts` kept (`harel-beanie status --json`, `/api/backlog`, `/metrics` text)."""
        from harel_beanie import queries
        from harel_beanie.core.documents import bind

        b = await queries.backlog(doc=bind(self.prefix)[0], stuck_after=STUCK_AFTER, show=SHOW)
        seen = {"queries.backlog": _from_backlog(b.as_dict(), SHOW)}
        problems = []
        for name, answer in answers.items():
            if answer is None:
                continue  # a source that failed is named by the counts' check already
            if name == "harel-beanie status --json":
                seen[name] = _from_backlog(answer, SHOW)
            elif name == "dashboard /api/backlog":
                seen[name] = _from_backlog(answer, DASHBOARD_SHOWS, silent="silent")
            elif name == "dashboard /metrics":
                seen[name], wrong = _from_metrics(answer, self.sampled_at, time.time())
                problems += [f"{when}: {WAITING_MISMATCH}: {wrong}"] if wrong else []
        problems += self._compare(seen, when, time.time())
        again = await raw_documents(self.url, self.db, self.prefix)
        if again != self.docs:
            problems.append(f"{when}: {WAITING_MISMATCH}: the documents changed during the check")
        return problems

    def _compare(self, seen: dict[str, Seen], when: str, t1: float) -> list[str]:
        early = stuck_by_definition(self.docs, after=STUCK_AFTER, now=self.t0)
        late = stuck_by_definition(self.docs, after=STUCK_AFTER, now=t1)
        first, last = pending_truth(self.docs, self.sampled_at), pending_truth(self.docs, t1)
        out = []
        for name, said in seen.items():
            out += [f"{when}: {WAITING_MISMATCH}: {name}: {p}" for p in _stuck_differs(said, early, late)]
            out += [f"{when}: {WAITING_MISMATCH}: {name}: {p}" for p in _pending_differs(said, first, last)]
        return out


def _from_backlog(data: dict[str, Any], limit: int, *, silent: str = "stuck") -> Seen:
    """A backlog as plain data: `Backlog.as_dict()`, `status --json`, `/api/backlog`."""
    return Seen(
        stuck=[row["id"] for row in data[silent]],
        limit=limit,
        pending={"outbox": data["pending_outbox"], "spawn": data["pending_spawns"]},
        ages={"outbox": data["oldest_outbox_age"], "spawn": data["oldest_spawn_age"]},
        holders={"outbox": [r["id"] for r in data["oldest_outbox"]], "spawn": [r["id"] for r in data["oldest_spawns"]]},
    )


def _from_metrics(text: str, sampled_at: float, now: float) -> tuple[Seen, Optional[str]]:
    """The gauges of one scrape; and what is wrong with the sample's age gauge, if anything."""
    from prometheus_client.parser import text_string_to_metric_families

    seen = Seen(ages={}, pending={})
    sample_age = math.nan
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "harel_executions_silent":
                seen.stuck_count = int(s.value)
            elif s.name == "harel_pending_entries":
                seen.pending[s.labels["kind"]] = int(s.value)
            elif s.name == "harel_pending_oldest_age_seconds":
                seen.ages[s.labels["kind"]] = s.value or None  # 0 when none is pending
            elif s.name == "harel_pending_sample_age_seconds":
                sample_age = s.value
    if not (0.0 <= sample_age <= now - sampled_at + SLACK):
        return seen, f"dashboard /metrics: sample age {sample_age}, a sample taken {now - sampled_at:.3f}s before"
    return seen, None


def _stuck_differs(said: Seen, early: set[Any], late: set[Any]) -> list[str]:
    if said.stuck is None:
        if said.stuck_count is None:
            return []
        low, high = min(len(early), METRICS_COUNTS), min(len(late), METRICS_COUNTS)
        if low <= said.stuck_count <= high:
            return []
        return [f"counts {said.stuck_count} stuck, the documents {len(early)} (up to {len(late)} by the check's end)"]
    shown = set(said.stuck)
    limit = said.limit if said.limit is not None else len(late)
    out = []
    if len(said.stuck) != len(shown):
        out.append(f"lists an execution twice as stuck: {said.stuck}")
    if not shown <= late:
        out.append(f"lists as stuck {sorted(map(str, shown - late))}, which the documents do not make stuck")
    if len(shown) < min(limit, len(early)) or (len(early) <= limit and not early <= shown):
        out.append(
            f"lists as stuck {sorted(map(str, shown))}, the documents say {sorted(map(str, early))}"
            f" (missing {sorted(map(str, early - shown))})"
        )
    return out


def _pending_differs(said: Seen, first: PendingTruth, last: PendingTruth) -> list[str]:
    out = []
    for kind in KINDS:
        n = said.pending.get(kind)
        if n != first.counts[kind]:
            out.append(f"{n} pending {kind} entries, the documents hold {first.counts[kind]}")
        low, high = first.oldest_age(kind), last.oldest_age(kind)
        got = said.ages.get(kind)
        if (got is None) != (low is None) or (
            got is not None and low is not None and high is not None and not low - SLACK <= got <= high + SLACK
        ):
            out.append(f"oldest {kind} entry {got} s old, the documents' {low} s (up to {high} s by the check's end)")
        if said.holders is not None:
            want = first.oldest_ids(kind, OLDEST)
            if said.holders[kind] != want:
                out.append(f"the oldest {kind} entries held by {said.holders[kind]}, the documents say {want}")
    return out
