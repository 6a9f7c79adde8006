"""The databases the scale benchmark (bench/scale/run.py) measures: N executions that look like a
shop's production data, in this package's layout and, beside it, in harel's MongoStore's.

How it seeds. The shop models (src/harel_beanie/demo/shop_models, what `harel-beanie demo` runs) are
driven by harel's DurableRunner on this package's MongoStore, with a manual clock, into a small
template database of *families* (a root execution and the children it spawned):

- finished: every scenario of the demo's mix (`harel_beanie.demo.mix.MIX`) run to its end
  (delivered, retried, declined, gave up, out of stock, cancelled, lost);
- waiting on a timer: an order cooling off (15 min), one in transit (7 days), a payment
  between retries;
- FAILED: a payment whose gateway call raises (the action is made to raise for that run);
- holding outbox work: an order cooling off with two events committed to its outbox through
  the store and not yet relayed.

For harel's side, each template execution is committed through harel's own MongoStore (its
snapshot, its outbox entries, its timers), so those documents are what harel writes.

Then each family is cloned with insert_many in large batches under a new root id of the
same length: the template's BSON with its root id replaced byte for byte (the id is in
`_id`, `parent_id`, `data`, the trace, the processed event ids), so nothing is re-encoded per
clone. What the store would write differently for the clone is set per variant: `part`
(`part_of` of the clone's id, shared by the family), the times (created, updated, finished
and `finished_on` moved into one of BUCKETS slices of the last SPAN_DAYS days, in the
snapshot too: 15-minute slices, so that a time search meets what production holds, executions
spread over the day, not a few thousand updated at one instant), the timers and, for outbox
work, fresh outbox seqs above any the store mints. Roots are chosen so that about 90% are
finished, 8% wait on a timer, 1% FAILED and 1% hold outbox work (`SHARE`; bench/scale/run.py's
`--shares` sets others), spread over the models.

The shape is what a statechart store holds in real life: the executions waiting on a timer
wait long (an order for its delivery, a payment to retry), their timers 1 to `waits` days
ahead (30 unless set) and their last update spread over as many days, so most RUNNING
executions have been silent for days and are not stuck; the finished and FAILED ones are
spread over the last SPAN_DAYS days, the outbox work over the last week, none of it relayed.
Each clone arrives as a fold of the counts leaves it (counted, and `quiet` where it waits on
nothing: `harel_beanie.core.stuck`).
"""

from __future__ import annotations

import datetime
import itertools
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import bson
import pymongo
from bson.raw_bson import RawBSONDocument
from harel.engine.durable import DurableRunner
from harel.engine.execution import Execution
from harel.engine.store.base import TimerOp
from harel.engine.store.mongo import MongoStore as HarelMongoStore
from harel.spec.states import Event

from harel_beanie import MongoStore
from harel_beanie.core.counting import COUNTED, COUNTED_SEQ, DIRTY, state_of
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, part_of
from harel_beanie.core.stuck import QUIET, quiet_of

EXECUTIONS = "harel_executions"
SHOP_MODELS = Path(__file__).resolve().parents[2] / "src" / "harel_beanie" / "demo" / "shop_models"
KINDS = ("finished", "timer", "failed", "outbox")
SHARE: dict[str, float] = {"finished": 90, "timer": 8, "failed": 1, "outbox": 1}  # of every 100 roots
DAY = 86_400.0
SPAN_DAYS, BUCKETS, WEEK = 30, 30 * 96, 7 * 86_400.0
#: the variants kept encoded at once: with 2,880 slices most clones are a variant of their own
#: at a million, and every one kept would hold gigabytes in this process
CACHED = 20_000
ID_LEN = 32  # every root id, template or clone: same length, so a byte replace keeps BSON valid
SEQ_BASE = 1 << 62  # the clones' outbox seqs: above anything the store's mint hands out
BATCH = 5_000
PICKS = 200  # roots of each kind remembered for the measurements


@dataclass
class Family:
    kind: str
    root: str
    definition: str
    docs: list[dict[str, Any]]  # this package's layout
    harel: list[dict[str, Any]] = field(default_factory=list)  # harel's MongoStore's


class Clock:
    def __init__(self, start: float) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t


def template_id(i: int) -> str:
    return f"T{i:03d}" + uuid.uuid4().hex[: ID_LEN - 4]


def _drive(runner: DurableRunner, clock: Clock, rid: str, scenario: Any, finish: bool) -> None:
    """One demo scenario: created, paid, cooled off, sealed, delivered (or lost); `finish`
    False stops it once in transit (its 7-day timer armed)."""
    runner.create(scenario.definition_id, scenario.context(rid), execution_id=rid)
    if scenario.cancel:
        runner.process(rid, Event(kind="Cancel"))
    for _ in range(40):  # payment retries, the charge budget, cooling off
        clock.t += 60.0
        runner.fire_due_timers()
    if scenario.seal:
        runner.process(rid, scenario.sealed(rid))
        if not finish:
            return
    if scenario.deliver:
        for event in scenario.delivery(rid):
            runner.process(rid, event)
    else:
        clock.t += 8 * 86_400.0
        runner.fire_due_timers()


def make_templates(url: str, db: str) -> list[Family]:
    """The template families, written by harel's runner through this package's store (see the
    module docstring), then the same executions through harel's MongoStore. Kept whole: the
    families are one script, each step driving the runner to the state the next one needs."""
    from harel_beanie.demo.mix import MIX
    from harel_beanie.deploy import load_models

    defs = load_models(SHOP_MODELS)
    import shop_actions  # type: ignore[import-not-found]  # on sys.path once the models load

    logging.getLogger("harel").setLevel(logging.CRITICAL)  # the FAILED template's traceback
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    store = MongoStore(client, db)
    store.init()
    clock = Clock(time.time() - 20 * 86_400.0)
    runner = DurableRunner(store, defs, clock=clock, trace=True)
    kinds: dict[str, str] = {}
    ids = (template_id(i) for i in itertools.count())
    for s in MIX:
        kinds[rid := next(ids)] = "finished"
        _drive(runner, clock, rid, s, finish=True)
    order, lost, payment = MIX[0], MIX[6], MIX[3]
    kinds[rid := next(ids)] = "timer"
    runner.create("Order", order.context(rid), execution_id=rid)  # cooling off
    kinds[rid := next(ids)] = "timer"
    _drive(runner, clock, rid, lost, finish=False)  # in transit
    kinds[rid := next(ids)] = "timer"
    runner.create("Payment", payment.context(rid), execution_id=rid)  # between retries
    authorize = shop_actions.authorize

    def unreachable(stm: Any, event: Any, **kw: Any) -> None:
        raise ConnectionResetError("payment gateway: connection reset by peer")

    shop_actions.authorize = unreachable
    try:
        kinds[rid := next(ids)] = "failed"
        runner.create("Payment", MIX[0].context(rid), execution_id=rid)
    finally:
        shop_actions.authorize = authorize
    kinds[rid := next(ids)] = "outbox"
    runner.create("Order", order.context(rid), execution_id=rid)
    exe = store.load(rid)
    assert exe is not None
    store.commit(
        exe, [(rid, Event(kind="Scan", data={"hub": "HUB-1"})), (rid, Event(kind="Scan", data={"hub": "HUB-2"}))]
    )
    coll = client[db][EXECUTIONS]
    families = []
    for rid, kind in kinds.items():
        docs = list(coll.find({"_id": {"$regex": f"^{rid}"}}).sort("_id", 1))
        root = next(d for d in docs if d["_id"] == rid)
        families.append(Family(kind, rid, root["definition_id"], docs))
    _harel_documents(client, db + "_harel", families)
    client.drop_database(db)
    client.drop_database(db + "_harel")
    client.close()
    return families


def _harel_documents(client: Any, db: str, families: list[Family]) -> None:
    """Each family's executions committed through harel's MongoStore: its own documents."""
    store = HarelMongoStore(client, db)
    for fam in families:
        for doc in fam.docs:
            exe = Execution.model_validate_json(doc["data"]).model_copy(update={"version": 0})
            emits = [(e["target_id"], Event.model_validate_json(e["event"])) for e in doc.get("outbox") or []]
            timers = tuple(TimerOp("schedule", k.replace("．", "."), v) for k, v in (doc.get("timers") or {}).items())
            store.commit(exe, emits, timers=timers)
        fam.harel = list(client[db][EXECUTIONS].find({"_id": {"$regex": f"^{fam.root}"}}).sort("_id", 1))


# --- variants and clones --------------------------------------------------------------------


def _shifted(doc: dict[str, Any], delta: float, fire: float, now: float) -> dict[str, Any]:
    """`doc` with its times moved by `delta` and its timers set to fire at `fire`."""
    out = dict(doc)
    for key in ("created_at", "updated_at", "finished_at"):
        if isinstance(out.get(key), (int, float)):
            out[key] = min(out[key] + delta, now)
    if isinstance(out.get("finished_at"), float):
        out["finished_on"] = datetime.datetime.fromtimestamp(out["finished_at"], datetime.timezone.utc)
    if out.get("timers"):
        out["timers"] = {k: fire for k in out["timers"]}
        if "next_fire" in out:
            out["next_fire"] = fire
    exe = Execution.model_validate_json(doc["data"])
    times = {
        k: min(getattr(exe, k) + delta, now)
        for k in ("created_at", "updated_at", "finished_at")
        if getattr(exe, k, None)
    }
    out["data"] = exe.model_copy(update=times).model_dump_json()
    return out


class Cloner:
    """Clones of the template families for one layout ("beanie" or "harel"), as raw BSON made
    once per family, time slice and partition, and a byte replace of the root id per clone."""

    def __init__(
        self,
        families: list[Family],
        layout: str,
        now: float,
        seed: int = 7,
        share: dict[str, float] = SHARE,
        waits: float = SPAN_DAYS,
    ) -> None:
        self.families = {k: [f for f in families if f.kind == k] for k in KINDS}
        self.share = {k: float(share.get(k, 0)) for k in KINDS}
        self.waits = waits  # days: how far ahead the timers are, and how long ago their last update
        self.layout = layout
        self.now = now
        self.rng = random.Random(seed)
        self.cache: dict[tuple[str, int, int], list[bytes]] = {}
        self.seq = SEQ_BASE
        self.n = 0  # documents cloned
        self.made = dict.fromkeys(KINDS, 0)  # ... of each kind
        self.picked: dict[str, list[str]] = {k: [] for k in KINDS}  # a sample of roots of each kind
        self.seen = dict.fromkeys(KINDS, 0)

    def _variant(self, fam: Family, bucket: int, part: int) -> list[bytes]:
        key = (fam.root, bucket, part)
        if key not in self.cache:
            waits = self.waits * DAY
            span = {"finished": SPAN_DAYS * DAY, "failed": SPAN_DAYS * DAY, "timer": waits}.get(fam.kind, WEEK)
            top = max(d["updated_at"] if "updated_at" in d else 0.0 for d in fam.docs)
            delta = self.now - span * (bucket + 0.5) / BUCKETS - top
            # a long wait's timer: 1 day to `waits` ahead, in an order of its own (a timer
            # armed long ago may fire soon, one armed yesterday in weeks)
            ahead = ((bucket * 7 + 3) % BUCKETS + 0.5) / BUCKETS
            fire = self.now + (DAY + max(0.0, waits - DAY) * ahead if fam.kind == "timer" else 60.0 + WEEK * ahead)
            docs = fam.docs if self.layout == "beanie" else fam.harel
            shaped = [_shifted(d, delta, fire, self.now) for d in docs]
            if self.layout == "beanie":
                # counted, as a deployment's workers leave what they folded: the counters are
                # then built from these states by one read per partition, not by marking each
                shaped = [_counted({**d, "part": part}) for d in shaped]
            if len(self.cache) >= CACHED:
                self.cache.clear()
            self.cache[key] = [bson.encode(d) for d in shaped]
        return self.cache[key]

    def _kind(self) -> str:
        """The kind furthest below its share of the documents cloned so far."""
        total = sum(self.share.values()) or 1.0
        return max(KINDS, key=lambda k: self.share[k] * (self.n + 1) / total - self.made[k])

    def family(self) -> Iterator[Any]:
        """The documents of one new family (root id: its definition's letter, then hex)."""
        fam = self.rng.choice(self.families[self._kind()])
        self.n += len(fam.docs)
        self.made[fam.kind] += len(fam.docs)
        new = fam.definition[0].lower() + uuid.uuid4().hex[: ID_LEN - 1]
        part = part_of(new, DEFAULT_PARTITIONS)
        self._pick(fam.kind, new)
        old, raw_new = fam.root.encode(), new.encode()
        for raw in self._variant(fam, self.rng.randrange(BUCKETS), part):
            doc = RawBSONDocument(raw.replace(old, raw_new))
            if fam.kind == "outbox":
                yield self._fresh_seqs(doc)
            else:
                yield doc

    def _pick(self, kind: str, root: str) -> None:
        """Reservoir sampling: PICKS roots of each kind, uniform over every clone made."""
        self.seen[kind] += 1
        ids = self.picked[kind]
        if len(ids) < PICKS:
            ids.append(root)
        elif (j := self.rng.randrange(self.seen[kind])) < PICKS:
            ids[j] = root

    def _fresh_seqs(self, raw: RawBSONDocument) -> dict[str, Any]:
        doc = bson.decode(raw.raw)
        if doc.get("outbox"):
            entries = []
            for e in doc["outbox"]:
                self.seq += 1
                entries.append({**e, "seq": self.seq})
            doc["outbox"] = entries
            if "seq_hi" in doc:
                doc["seq_hi"] = self.seq
        return doc


def grow(coll: Any, cloner: Cloner, target: int, say: Callable[[str], None], reindex: Callable[[], None]) -> float:
    """Clone families into `coll` until it holds at least `target` documents; seconds taken.
    The secondary indexes are dropped first and built again at the end by `reindex` (the
    store's own set-up): on SecantusDB that is several times faster than inserting into them."""
    t = time.perf_counter()
    coll.drop_indexes()
    have = coll.estimated_document_count()
    batch: list[Any] = []
    last = time.perf_counter()
    while have < target:
        for doc in cloner.family():
            batch.append(doc)
            have += 1
        if len(batch) >= BATCH or have >= target:
            coll.insert_many(batch, ordered=False)
            batch = []
            if time.perf_counter() - last > 15:
                last = time.perf_counter()
                say(f"  {coll.database.name}: {have:,} of {target:,} ({have / (last - t):,.0f}/s)")
    say(f"  {coll.database.name}: {have:,} documents, building the indexes")
    reindex()
    return time.perf_counter() - t


def _counted(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` as a fold leaves it: counted under its state, no longer marked dirty."""
    out = {k: v for k, v in doc.items() if k not in (DIRTY, QUIET)}
    state = state_of(out)
    if state is not None:
        out[COUNTED], out[COUNTED_SEQ] = state, 0
    quiet = quiet_of(out)
    if quiet is not None:
        out[QUIET] = quiet
    return out


def parse_shares(text: str) -> dict[str, float]:
    """`--shares`: `kind=n,...` over the kinds (finished, timer, failed, outbox); a kind left
    out has none. The numbers are weights: they need not add up to 100."""
    out = dict.fromkeys(KINDS, 0.0)
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, n = part.partition("=")
        if kind not in KINDS:
            raise ValueError(f"--shares: {kind!r} is not one of {', '.join(KINDS)}")
        out[kind] = float(n)
        if not out[kind] >= 0:
            raise ValueError(f"--shares: {part!r} is not a weight of 0 or more")
    if not sum(out.values()) > 0:
        raise ValueError("--shares: at least one kind needs a weight above 0")
    return out
