"""Layout version 1 (`0001_adopt_harel_mongostore`): harel's MongoStore layout to this store's.

- up: backfills what this store adds to an execution's document (the summary fields copied
  from `data`, `next_fire`, `trace_n`, `seq_hi`), moves harel's per-execution trace counters
  into `trace_n`, creates the indexes, checks that no seq this store can mint reaches harel's
  outbox/spawn counters, and records version 1. Spawn contexts and trace steps stay in
  harel's forms: this store reads both.
- down: converts what harel's store cannot read back to its forms (spawn contexts as
  dicts, trace steps as dicts with their index, harel's timer keys), raises harel's
  outbox/spawn counters to at least every pending seq (so harel hands out larger, unique
  seqs) and its trace counters to each `trace_n`, removes the added fields; the recorded
  version and the indexes go first.

How it is run (batches, guarded writes, resuming) is `harel_beanie.migrate.engine`'s job.
"""

from __future__ import annotations

from typing import Any, Optional

from harel.engine.execution import Execution
from pydantic import ValidationError
from pymongo import DeleteOne, UpdateOne

from harel_beanie.core import records
from harel_beanie.core.commit import summary_fields
from harel_beanie.core.documents import LAYOUT_1_INDEXES, SCHEMA_MARKER_ID, ExecutionDocument, index_models
from harel_beanie.core.keys import harel_timer_key
from harel_beanie.core.seqs import EPOCH_MS, HAREL_SEQ_COUNTERS, NODE_BITS, SEQ_BITS
from harel_beanie.migrate.step import Migration, MigrationError, Step

# harel's MongoStore: the seq counter of each pending array, its per-execution trace counter
_HAREL_SEQ_COUNTERS = dict(zip(("outbox", "spawns"), HAREL_SEQ_COUNTERS))
_HAREL_TRACE_COUNTER = "trace:"

#: The fields version 1 adds to an execution's document.
ADDED_FIELDS = (
    "status",
    "outcome",
    "active_path",
    "parent_id",
    "created_at",
    "updated_at",
    "finished_at",
    "finished_on",
    "next_fire",
    "trace_n",
    "seq_hi",
    "commit_token",  # written by releases before the token ring
    "commit_tokens",
    "born",
    "buried",
)


# the store's indexes (`bind(prefix)` differs from the default classes only in the
# collection names, and the migrator addresses the prefix's collections itself)
_INDEXES = index_models(ExecutionDocument)
# version 1's own indexes: today's, with the pending-work ones as they were before version 2
_LAYOUT_1 = [ix for ix in _INDEXES if "partialFilterExpression" not in ix.document] + LAYOUT_1_INDEXES


class AdoptHarelLayout(Step):
    """Version 1: harel's MongoStore layout (version 0) to this store's."""

    version = 1
    name = "0001_adopt_harel_mongostore"
    # never `processed`: harel's store lets it grow without bound
    up_projection = {
        "version": 1,
        "data": 1,
        "timers": 1,
        "outbox.seq": 1,
        "spawns.seq": 1,
        "trace": 1,
        **{f: 1 for f in ADDED_FIELDS},
    }
    down_projection = {
        "version": 1,
        "timers": 1,
        "outbox.seq": 1,
        "spawns": 1,
        "trace": 1,
        **{f: 1 for f in ADDED_FIELDS},
    }

    # --- up ---------------------------------------------------------------------------------

    async def before_up(self, m: Migration) -> None:
        # this store's seqs start above every value harel's counters handed out; check it,
        # rather than trust it (a counter raised by an earlier `down` is near our range)
        floor = _mint_floor(m)
        for name in _HAREL_SEQ_COUNTERS.values():
            c = await m.counters.find_one({"_id": name})
            if c is not None and int(c.get("n") or 0) >= floor:
                raise MigrationError(
                    f"harel's {name!r} counter in {m.where} is at {c['n']}, at or above the seqs "
                    f"this store mints now ({floor}): a seq could collide; is a server clock behind?"
                )

    async def up_batch(self, m: Migration, docs: list[dict[str, Any]]) -> int:
        ids = [d["_id"] for d in docs]
        trace_counters: dict[str, int] = {}
        if ids:
            found = await m.counters.find({"_id": {"$in": [_HAREL_TRACE_COUNTER + i for i in ids]}}).to_list(None)
            trace_counters = {c["_id"][len(_HAREL_TRACE_COUNTER) :]: int(c.get("n") or 0) for c in found}
        updated = await m.write_guarded(
            docs, lambda d: adopt_update(d, trace_counters.get(d["_id"])), self.up_projection
        )
        if trace_counters:
            # folded into `trace_n`; a re-run without them keeps it (`trace_n` only grows)
            await m.counters.bulk_write(
                [DeleteOne({"_id": _HAREL_TRACE_COUNTER + i}) for i in trace_counters], ordered=False
            )
        return updated

    async def after_up(self, m: Migration) -> None:
        await m.exes.create_indexes(_LAYOUT_1)
        await m.counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": self.version}}, upsert=True)

    # --- down -------------------------------------------------------------------------------

    async def before_down(self, m: Migration) -> None:
        # no record = version 0, which this store serves in compatibility mode: it reads both
        # layouts, so it stays correct on a half-converted database, and needs none of the
        # indexes (dropped first: every rewrite below would otherwise update them)
        await m.counters.delete_one({"_id": SCHEMA_MARKER_ID})
        await _drop_indexes(m)
        # harel's store reads every document as an execution: purged executions' tombstones
        # (which it has no use for: it deletes on purge) go, and so do the seq leases
        await m.exes.delete_many({"tomb": {"$exists": True}})
        await m.counters.delete_many({"_id": {"$regex": "^harel_beanie:node:"}})

    async def down_batch(self, m: Migration, docs: list[dict[str, Any]]) -> int:
        async def raise_counters(batch: list[dict[str, Any]]) -> None:
            # before the documents: a re-run after an interruption still sees every seq,
            # which stays pending in its document either way
            for array, counter in _HAREL_SEQ_COUNTERS.items():
                hi = max((e["seq"] for d in batch for e in d.get(array) or ()), default=None)
                if hi is not None:
                    await m.counters.update_one({"_id": counter}, {"$max": {"n": hi}}, upsert=True)
            traced = [
                UpdateOne({"_id": _HAREL_TRACE_COUNTER + d["_id"]}, {"$max": {"n": int(d["trace_n"])}}, upsert=True)
                for d in batch
                if d.get("trace_n")
            ]
            if traced:
                await m.counters.bulk_write(traced, ordered=False)

        return await m.write_guarded(docs, restore_update, self.down_projection, before=raise_counters)

    async def after_down(self, m: Migration) -> None:
        await _drop_indexes(m)  # a store started meanwhile creates them again


def _mint_floor(m: Migration) -> int:
    """The smallest seq this store can mint from now on (see `harel_beanie.core.seqs`)."""
    return (m.clock_ms() - EPOCH_MS) << (NODE_BITS + SEQ_BITS)


async def _drop_indexes(m: Migration) -> None:
    names = {ix.document["name"] for ix in [*_INDEXES, *LAYOUT_1_INDEXES]}
    for name in [ix["name"] async for ix in await m.exes.list_indexes()]:
        if name in names:
            await m.exes.drop_index(name)


def adopt_update(doc: dict[str, Any], trace_counter: Optional[int]) -> Optional[dict[str, Any]]:
    """The update bringing one harel-layout document to version 1 (None: already there)."""
    want: dict[str, Any] = {}
    if doc.get("data") is not None:
        try:
            exe = Execution.model_validate_json(doc["data"])
        except ValidationError as err:
            why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'data'}: {e['msg']}" for e in err.errors()[:3])
            raise MigrationError(f"execution {doc['_id']!r}: its `data` is not an Execution ({why})") from None
        want.update(summary_fields(exe))
    timers = doc.get("timers") or {}
    # steps ever written: harel's counter, or this store's count, or what the ring shows
    want["trace_n"] = max(doc.get("trace_n") or 0, trace_counter or 0, _ring_count(doc.get("trace") or []))
    sets = {k: v for k, v in want.items() if k not in doc or doc[k] != v}
    unset: dict[str, str] = {}
    # `seq_hi` and `next_fire` are absent, never null, when there is none: `$max`/`$min`
    # keep a null (it sorts below every number)
    seqs = [e["seq"] for array in ("outbox", "spawns") for e in doc.get(array) or ()]
    if isinstance(doc.get("seq_hi"), int):
        seqs.append(doc["seq_hi"])
    for name, value in (("seq_hi", max(seqs, default=None)), ("next_fire", min(timers.values(), default=None))):
        if value is None:
            if name in doc:
                unset[name] = ""
        elif doc.get(name) != value:
            sets[name] = value
    return _update(sets, unset)


def _ring_count(trace: list[dict[str, Any]]) -> int:
    """The fewest trace steps ever written that the ring can show: past the last step
    harel's store wrote (it holds its index), one for each of this store's steps after it.
    A store in compatibility mode counted only its own steps in `trace_n`; this raises such
    a count past harel's, so the steps keep distinct indexes."""
    count = 0
    for item in trace:
        if _is_harel_step(item) and isinstance(item.get("index"), int):
            count = item["index"] + 1
        else:
            count += 1
    return count


def restore_update(doc: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The update bringing one version-1 document back to harel's layout (None: already)."""
    sets: dict[str, Any] = {}
    spawns = doc.get("spawns") or []
    if any(isinstance(s.get("context"), str) for s in spawns):
        sets["spawns"] = [{**s, "context": records.spawn_context(s["context"])} for s in spawns]
    trace = doc.get("trace") or []
    if any(not _is_harel_step(item) for item in trace):
        sets["trace"] = records.trace_steps(doc)
    timers = doc.get("timers") or {}
    harel_timers = {harel_timer_key(k): at for k, at in timers.items()}
    if list(harel_timers) != list(timers):
        sets["timers"] = harel_timers
    unset = {f: "" for f in ADDED_FIELDS if f in doc}
    return _update(sets, unset)


def _update(sets: dict[str, Any], unset: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The update document setting `sets` and removing `unset`; None when both are empty."""
    update = {op: fields for op, fields in (("$set", sets), ("$unset", unset)) if fields}
    return update or None


def _is_harel_step(item: dict[str, Any]) -> bool:
    return not (len(item) == 1 and isinstance(item.get("t"), str))
