"""Reference models of the writing doors: given the whole database before a write (a snapshot
of every collection) and the write's arguments, the whole database after it.

Why this module exists: the hostile-value layer (tests/doors/test_hostile_values.py) only
said which documents a write may touch, so a purge that corrupted its own tombstone or a fold
that zeroed every counter passed. These models say what each write makes of every document,
field by field, written apart from the code they check (they restate the documented rules:
core/commit.py, core/counting.py's Rules 1-5, transport/queues.py's Rules 1-6, the purge's
tombstone), so a fault in the code is not copied into its oracle. The few values no model
can predict (random tokens, the mint's seqs, the server's clock) are `Drawn` placeholders,
each with the reason it is one and a check of its form; the clocks the code takes from a
seam (the store's and the transport's `clock`) are pinned by the tests instead.

`expect_equal(door, expected, after)` compares two whole snapshots and names every
difference; the models never mutate the snapshot they are given.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping, Optional, Sequence

Snapshot = dict[str, dict[Any, dict[str, Any]]]

EXES, COUNTERS, COUNTS = "harel_executions", "harel_counters", "harel_hb_counts"
QUEUES, OVERFLOW = "harel_hb_queues", "harel_hb_overflow"
PARTS = 16  # partitions of a database made with the defaults
COMMIT_TOKENS = 16  # commit tokens an execution keeps
BURIED_MAX = 64  # creations a tombstone keeps
NO_ID = "\U0010ffff"  # an empty counter's `low`
FRESH_OFFSET = 2.0**34  # a fresh group's claim key: its publish time less this
SCHEMA_VERSION = 4  # the layout a database made by this version records
EPOCH_ID, EPOCH_SPAN = "hb_counts_epoch", 2**40  # the counters' epochs, and the seqs each spans


# --- values no model can predict ---------------------------------------------------------------


@dataclass(eq=False)
class Drawn:
    """A value the code draws (a token, a seq, the server's time): it matches any value
    `form` accepts, and every placeholder of the same `name` in one comparison must match the
    same value (the token a new document is born with is its first commit token)."""

    name: str
    form: Callable[[Any], bool]
    why: str


def hex_token(name: str, why: str) -> Drawn:
    return Drawn(name, lambda v: isinstance(v, str) and len(v) == 16 and all(c in "0123456789abcdef" for c in v), why)


def snapshot(db: Any) -> Snapshot:
    """Every document of every collection of the database, by collection and `_id`."""
    return {name: {d["_id"]: d for d in db[name].find({})} for name in db.list_collection_names()}


def differences(expected: Any, got: Any, where: str, bound: dict[str, Any]) -> list[str]:
    if isinstance(expected, Drawn):
        if not expected.form(got):
            return [f"{where}: {got!r} is not a {expected.name} ({expected.why})"]
        if expected.name in bound and bound[expected.name] != got:
            return [f"{where}: {got!r}, but the {expected.name} elsewhere is {bound[expected.name]!r}"]
        bound[expected.name] = got
        return []
    if isinstance(expected, dict) and isinstance(got, dict):
        out = []
        drawn = [k for k in expected if isinstance(k, Drawn)]  # a key the code draws (a new `_id`)
        if drawn:
            expected = dict(expected)
            unmatched = sorted((k for k in got if k not in expected), key=repr)
            if len(unmatched) != len(drawn):
                return [f"{where}: new keys {unmatched!r}, expected {len(drawn)} new ({drawn[0].why})"]
            for d in drawn:  # each paired with the new key whose document it matches
                fits = [k for k in unmatched if not _pair_differs(d, expected[d], k, got[k], bound)]
                k = fits[0] if fits else unmatched[0]
                unmatched.remove(k)
                out += differences(d, k, f"{where}[{k!r}]", bound)
                expected[k] = expected.pop(d)
        for k in expected.keys() | got.keys():
            if k not in got:
                out.append(f"{where}.{k}: missing (expected {expected[k]!r})")
            elif k not in expected:
                out.append(f"{where}.{k}: unexpected {got[k]!r}")
            else:
                out += differences(expected[k], got[k], f"{where}.{k}", bound)
        return out
    if isinstance(expected, list) and isinstance(got, list) and len(expected) == len(got):
        return [m for i, (e, g) in enumerate(zip(expected, got)) for m in differences(e, g, f"{where}[{i}]", bound)]
    same = type(expected) is type(got) or (_number(expected) and _number(got))
    return [] if same and expected == got else [f"{where}: {got!r}, expected {expected!r}"]


def _pair_differs(key: Drawn, want: Any, k: Any, doc: Any, bound: dict[str, Any]) -> bool:
    trial = dict(bound)
    return bool(differences(key, k, "", trial) or differences(want, doc, "", trial))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def expect_equal(door: str, expected: Snapshot, after: Snapshot) -> None:
    """Fail, naming each difference, unless `after` is `expected` (collections that are
    empty on one side and absent on the other are the same)."""
    found: list[str] = []
    bound: dict[str, Any] = {}
    for coll in sorted(expected.keys() | after.keys()):
        want, got = expected.get(coll, {}), after.get(coll, {})
        found += differences(want, got, coll, bound)
    assert not found, f"{door}: the database is not what its model says:\n  " + "\n  ".join(sorted(found)[:20])


# --- small restatements of the stored forms ---------------------------------------------------


def part_of(execution_id: str, parts: int = PARTS) -> int:
    """An id's partition: BLAKE2b (8 bytes, big-endian) of the text before its first ':'."""
    key = execution_id.split(":", 1)[0].encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % parts


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False, default=str)


def dedupe_key(event_id: str) -> str:
    raw = event_id.encode("utf-8", "surrogatepass")
    return event_id if len(raw) <= 128 else "sha256:" + hashlib.sha256(raw).hexdigest()


def bson_date(seconds: float) -> datetime:
    return datetime(1970, 1, 1) + timedelta(milliseconds=int(seconds * 1000))


def counted_as(doc: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """What the counts count a document as (core/counting.py Rule 1, restated)."""
    if doc.get("leaving"):
        return None
    if "tomb" in doc:
        return {"t": 1}
    if doc.get("definition_id") is None:
        return None
    status = doc.get("status")  # its status and definition, not its version
    return {"d": str(doc["definition_id"]), "s": status if isinstance(status, str) else "UNKNOWN"}


def holds_entries(doc: Mapping[str, Any]) -> bool:
    return bool(doc.get("outbox")) or bool(doc.get("spawns"))


def with_pending(doc: dict[str, Any]) -> dict[str, Any]:
    """A write that removes entries sets `pending` exactly while some remain."""
    doc.pop("pending", None)
    if holds_entries(doc):
        doc["pending"] = True
    return doc


# --- the store's writes -------------------------------------------------------------------------


@dataclass
class Commit:
    """One `commit` call: harel's arguments, the version the execution was loaded at, the
    store's bounds, and the seqs the mint handed out for it (recorded on the way: `Drawn`
    would lose which entry got which)."""

    exe: Any
    version: int
    emits: Sequence[tuple[Optional[str], Any]] = ()
    processed: Optional[str] = None
    timers: Sequence[Any] = ()
    spawns: Sequence[tuple[str, str, dict[str, Any]]] = ()
    trace: Optional[dict[str, Any]] = None
    seqs: list[int] = field(default_factory=list)
    ring: int = 1000
    window: int = 1000
    encode: Callable[[str], str] = str  # a timer path's key (core/keys.py's encoding, its own tests)
    step: Any = None  # harel's description (`Step`): its `from_status` may be wrong


def commit(before: Snapshot, c: Commit) -> tuple[Snapshot, str]:
    """The whole database after `c`, and its outcome: "landed" or "conflict"."""
    after = copy.deepcopy(before)
    exes = after.setdefault(EXES, {})
    stored = exes.get(c.exe.id)
    tomb = stored is not None and "tomb" in stored
    if c.version == 0 and (stored is None or tomb):
        exes[c.exe.id] = _created(c, stored)
        return after, "landed"
    if stored is None or tomb or stored.get("version") != c.version:
        return before, "conflict"
    exes[c.exe.id] = _updated(stored, c)
    return after, "landed"


def _entries(c: Commit) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    out_seqs, spawn_seqs = c.seqs[: len(c.emits)], c.seqs[len(c.emits) :]
    outbox = [{"seq": s, "target_id": t, "event": e.model_dump_json()} for s, (t, e) in zip(out_seqs, c.emits)]
    spawns = [
        {"seq": s, "parent_id": c.exe.id, "child_id": cid, "root_path": rp, "context": compact(dict(ctx))}
        for s, (cid, rp, ctx) in zip(spawn_seqs, c.spawns)
    ]
    return outbox, spawns


def _timers(c: Commit) -> dict[str, Optional[float]]:
    """Path -> fire time (None: cancelled), the last op per path winning."""
    out: dict[str, Optional[float]] = {}
    for op in c.timers:
        out[op.path] = float(op.fire_at) if op.action == "schedule" else None
    return out


def _summary(c: Commit) -> dict[str, Any]:
    exe = c.exe
    return {
        "data": exe.model_copy(update={"version": c.version + 1}).model_dump_json(),
        "version": c.version + 1,
        "status": exe.status.value,
        "outcome": exe.outcome,
        "active_path": exe.active_path,
        "parent_id": exe.parent_id,
        "created_at": exe.created_at,
        "updated_at": exe.updated_at,
        "finished_at": exe.finished_at,
        "finished_on": None if exe.finished_at is None else bson_date(exe.finished_at),
        "cdirty": True,  # left to be folded, unless it keeps what it is counted as (Rule 2)
    }


#: the random token of one commit, written to `commit_tokens` (and `born` for a creation)
COMMIT_TOKEN = hex_token("commit token", "os.urandom: tells a writer whose reply was lost that it landed")


def _created(c: Commit, tombstone: Optional[dict[str, Any]]) -> dict[str, Any]:
    outbox, spawns = _entries(c)
    armed = {p: at for p, at in _timers(c).items() if at is not None}
    doc: dict[str, Any] = {
        "_id": c.exe.id,
        "definition_id": c.exe.definition_id,
        **_summary(c),
        "outbox": outbox,
        "spawns": spawns,
        "processed": [dedupe_key(c.processed)] if c.processed is not None else [],
        "timers": {c.encode(p): at for p, at in armed.items()},
        "trace": [{"t": compact(c.trace)}] if c.trace is not None else [],
        "trace_n": 1 if c.trace is not None else 0,
        "commit_tokens": [COMMIT_TOKEN],
        "born": COMMIT_TOKEN,
        "part": part_of(c.exe.id),
    }
    if outbox or spawns:
        doc["pending"] = True
    if armed:
        doc["next_fire"] = min(armed.values())
    if c.seqs:
        doc["seq_hi"] = max(c.seqs)
    if tombstone is not None:  # a reused id: the tombstone's creations and counts mark go on
        doc["buried"] = list(tombstone["tomb"].get("buried", []))
        doc.update({k: tombstone[k] for k in ("cc", "cseq") if tombstone.get(k) is not None})
    return doc


def _updated(stored: dict[str, Any], c: Commit) -> dict[str, Any]:
    doc = copy.deepcopy(stored)
    outbox, spawns = _entries(c)
    kept = _keeps_counted(stored, c)
    doc.update(_summary(c))
    if kept:
        # what it is counted as is as it was: the counts are left alone (Rule 2), and
        # `quiet` is what the document after it calls for (set below, core.stuck)
        if not stored.get("cdirty"):
            del doc["cdirty"]
    else:
        doc.pop("leaving", None)  # a commit keeps an execution prune had begun removing
        doc.pop("quiet", None)  # no longer silent: the next fold decides again (core.stuck)
    timers = doc.setdefault("timers", {})
    known = isinstance(timers, dict) and all(_number(at) for at in timers.values())
    for path, at in _timers(c).items():
        if at is None:
            timers.pop(c.encode(path), None)
        else:
            timers[c.encode(path)] = at
    armed = [at for at in _timers(c).values() if at is not None]
    if _timers(c) and known:
        # the earliest of the timers it leaves, or none (core.stuck, Rule T1): what the
        # document held at the version it writes over, less its cancels, with its schedules
        doc.pop("next_fire", None)
        if timers:
            doc["next_fire"] = min(timers.values())
    elif armed:  # timers it cannot read as fire times: a lower bound, only lowered
        doc["next_fire"] = min([*armed, *([doc["next_fire"]] if "next_fire" in doc else [])])
    doc["commit_tokens"] = (list(doc.get("commit_tokens") or []) + [COMMIT_TOKEN])[-COMMIT_TOKENS:]
    doc["outbox"] = list(doc.get("outbox") or []) + outbox
    doc["spawns"] = list(doc.get("spawns") or []) + spawns
    if outbox or spawns:
        doc["pending"] = True
    if c.trace is not None:
        doc["trace"] = (list(doc.get("trace") or []) + [{"t": compact(c.trace)}])[-c.ring :]
        doc["trace_n"] = int(doc.get("trace_n") or 0) + 1
    if c.processed is not None:
        doc["processed"] = (list(doc.get("processed") or []) + [dedupe_key(c.processed)])[-c.window :]
    if c.seqs:
        doc["seq_hi"] = max([*c.seqs, *([doc["seq_hi"]] if "seq_hi" in doc else [])])
    if kept:
        doc.pop("quiet", None)
        if doc["status"] == "RUNNING" and not doc.get("pending") and "next_fire" not in doc:
            if isinstance(doc.get("updated_at"), (int, float)):
                doc["quiet"] = float(doc["updated_at"])
    return doc


def _keeps_counted(stored: Mapping[str, Any], c: Commit) -> bool:
    """Whether the commit leaves the counts alone (core/counting.py, Rule 2): harel says the
    status stays, it cancels no timer, and the document truly holds the status and
    definition it writes and no leaving mark. (What it waits on, which decides its `quiet`,
    is pinned as the store's load just before the commit saw it: it holds here.)"""
    step, exe = c.step, c.exe
    if step is None or step.from_status != exe.status or None in _timers(c).values():
        return False
    if stored.get("status") != exe.status.value or stored.get("definition_id") != exe.definition_id:
        return False
    return "leaving" not in stored


def purge(before: Snapshot, execution_id: str, expected_version: int, now: float) -> tuple[Snapshot, bool]:
    """The execution replaced by its tombstone if at `expected_version`, then every entry
    other executions addressed to it gone; an execution that moved on: nothing at all."""
    after = copy.deepcopy(before)
    exes = after.get(EXES, {})
    doc = exes.get(execution_id)
    purged = False
    if doc is not None and "tomb" not in doc:
        if doc.get("version") != expected_version:
            return before, False
        born = [doc["born"]] if doc.get("born") else []
        buried = (list(doc.get("buried") or []) + born)[-BURIED_MAX:]
        tomb: dict[str, Any] = {
            "_id": execution_id,
            # `by`: os.urandom, how a purge whose reply was lost knows the tombstone is its own
            "tomb": {"at": now, "buried": buried, "by": hex_token("purge token", "os.urandom, the purge's own")},
            "part": part_of(execution_id),
            "cdirty": True,  # the tombstone is counted anew by the next fold (Rule 2)
        }
        tomb.update({k: doc[k] for k in ("cc", "cseq") if doc.get(k) is not None})  # the lineage goes on
        exes[execution_id] = tomb
        purged = True
    for i, holder in list(exes.items()):
        if holder.get("pending") is True and any(
            e.get("target_id") == execution_id for e in holder.get("outbox") or []
        ):
            holder["outbox"] = [e for e in holder["outbox"] if e.get("target_id") != execution_id]
            with_pending(holder)
    return after, purged


def ack(before: Snapshot, array: str, seq: int) -> Snapshot:
    """The entry `seq` of `array` gone from the document holding it (seqs are unique)."""
    after = copy.deepcopy(before)
    for doc in after.get(EXES, {}).values():
        if doc.get("pending") is True and any(e.get("seq") == seq for e in doc.get(array) or []):
            doc[array] = [e for e in doc[array] if e.get("seq") != seq]
            with_pending(doc)
            doc["cdirty"] = True  # it may wait on nothing now: the fold decides its quiet
    return after


def delete_timer(before: Snapshot, execution_id: str, key: str, fire_at: float) -> Snapshot:
    """The timer under `key` gone if it still fires at `fire_at`, and the execution's bound
    its earliest remaining timer (none: no bound)."""
    after = copy.deepcopy(before)
    doc = after.get(EXES, {}).get(execution_id)
    timers = (doc or {}).get("timers")
    if not isinstance(timers, dict) or key not in timers or timers[key] != fire_at:
        return before
    del timers[key]
    assert doc is not None
    doc.pop("next_fire", None)
    if timers:
        doc["next_fire"] = min(timers.values())
    doc["cdirty"] = True  # it may wait on nothing now: the fold decides its quiet
    return after


def append_trace(before: Snapshot, execution_id: str, entry: dict[str, Any], ring: int) -> Snapshot:
    after = copy.deepcopy(before)
    doc = after.get(EXES, {}).get(execution_id)
    if doc is None or "tomb" in doc:
        return before
    doc["trace"] = (list(doc.get("trace") or []) + [{"t": compact(entry)}])[-ring:]
    doc["trace_n"] = int(doc.get("trace_n") or 0) + 1
    return after


# --- the counts' fold (core/counting.py, Rules 1, 3 and the build, restated) ---------------------


def _esc(text: str) -> str:
    return text.replace("%", "%25").replace(".", "%2E").replace("$", "%24").replace("\x00", "%00")


def _add(inc: dict[str, int], cc: Optional[Mapping[str, Any]], sign: int) -> None:
    """What counting a document as `cc` adds to a counter's fields."""
    if not cc:
        return
    if cc.get("t"):
        inc["t"] = inc.get("t", 0) + sign
        return
    path = ("n", "d" + _esc(str(cc["d"])), "s" + _esc(str(cc["s"])))
    inc[".".join(path)] = inc.get(".".join(path), 0) + sign


def _apply(counter: dict[str, Any], inc: Mapping[str, int]) -> None:
    for path, n in inc.items():
        if not n:
            continue  # a fold sends only the deltas that move something
        *parents, last = path.split(".")
        at = counter
        for p in parents:
            at = at.setdefault(p, {})
        at[last] = at.get(last, 0) + n


def _entry(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A batch's record of one document: what it is now counted as, and what pins it."""
    entry: dict[str, Any] = {"_id": doc["_id"], "cc": counted_as(doc)}
    if "tomb" in doc:
        entry["at"] = doc["tomb"].get("at")
        if doc["tomb"].get("buried"):
            entry["k"] = doc["tomb"]["buried"][-1]
    else:
        entry.update(v=doc.get("version"), b=doc.get("born"), l=bool(doc.get("leaving")))
        # the quiet its mark sets, and what pins that (an ack or a timer removal changes
        # them without a new version: core.stuck)
        entry.update(q=quiet_as(doc), p=bool(doc.get("pending")), f=doc.get("next_fire"))
    return entry


def _fresh_counters(after: Snapshot, parts: Sequence[int]) -> None:
    """The counters of `parts` where there are none, unbuilt, at a new epoch's base
    (core.counting, Rule 6): one epoch drawn for all of them."""
    counts = after.setdefault(COUNTS, {})
    missing = [p for p in parts if p not in counts]
    if not missing:
        return
    epoch = after.setdefault(COUNTERS, {}).setdefault(EPOCH_ID, {"_id": EPOCH_ID, "n": 0})
    epoch["n"] = int(epoch.get("n") or 0) + 1
    base = epoch["n"] * EPOCH_SPAN
    for part in missing:
        counts[part] = {"_id": part, "part": part, "seq": base, "n": {}, "t": 0, "last": [], "built": False}


def _build(exes: dict[Any, dict[str, Any]], counts: dict[Any, dict[str, Any]], part: int) -> None:
    """A partition's counter built: every document never counted and not dirty given its
    `cc`, every older mark raised to the counter's base (Rule 6), the counter the sums of
    its partition's `cc`."""
    counter = counts[part]
    base = int(counter.get("seq") or 0)
    mine = [d for d in exes.values() if d.get("part") == part]
    for d in mine:
        if "cc" not in d and "cdirty" not in d:
            d["cc"], d["cseq"] = counted_as(d), base
            _quiet(d, quiet_as(d))
        elif isinstance(d.get("cseq"), int) and d["cseq"] < base:
            d["cseq"] = base
    if counter.get("built"):
        return
    sums: dict[str, int] = {}
    counted = [d for d in mine if isinstance(d.get("cc"), dict)]
    for d in counted:
        _add(sums, d["cc"], +1)
    counter.update(n={}, t=0, built=True)
    _apply(counter, sums)
    ids = [d["_id"] for d in counted if isinstance(d["_id"], str)]
    counter["low"] = min(ids, default=NO_ID)


def fold(before: Snapshot, parts: Optional[Sequence[int]], ids: Optional[Sequence[str]]) -> tuple[Snapshot, int]:
    """The dirty documents of `parts` (of `ids` only, if given) folded into their counters,
    counters not built yet built first; on a quiet database, one batch per partition. Returns
    how many documents were folded."""
    after = copy.deepcopy(before)
    exes, counts = after.setdefault(EXES, {}), after.setdefault(COUNTS, {})
    chosen = sorted(set(parts)) if parts is not None else list(range(PARTS))
    unbuilt = [p for p in chosen if not counts.get(p, {}).get("built")]
    if unbuilt and (after.get(COUNTERS, {}).get(MARKER) or {}).get("n") == SCHEMA_VERSION:
        _fresh_counters(after, unbuilt)
        for part in unbuilt:
            _build(exes, counts, part)
    folded = 0
    for part in chosen:
        counter = counts.get(part) or {}
        if not counter.get("built"):
            continue  # no build before the layout is recorded whole: no fold either
        seq = int(counter.get("seq") or 0)
        if counter.get("last") and not counter.get("marked"):
            _mark(exes, part, seq, counter["last"])
            counter["marked"] = True
        dirty = sorted(
            (d for d in exes.values() if d.get("part") == part and d.get("cdirty") is True),
            key=lambda d: d["_id"],
        )
        if ids is not None:
            dirty = [d for d in dirty if d["_id"] in ids]
        if not dirty:
            continue
        inc: dict[str, int] = {}
        for d in dirty:
            _add(inc, _counted_by(d, counter), -1)
            _add(inc, counted_as(d), +1)
        entries = [_entry(d) for d in dirty]
        _apply(counter, inc)
        counter["seq"], counter["last"], counter["marked"] = seq + 1, entries, True
        low = [d["_id"] for d in dirty if isinstance(d["_id"], str)]
        if isinstance(counter.get("low"), str) and low:
            counter["low"] = min(counter["low"], *low)
        _mark(exes, part, seq + 1, entries)
        folded += len(dirty)
    return after, folded


def _counted_by(doc: Mapping[str, Any], counter: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """What the counter counts a document as: the last batch's entry while that batch is
    not marked on it, else its own `cc` (Rule 4)."""
    if int(doc.get("cseq") or 0) < int(counter.get("seq") or 0):
        for e in counter.get("last") or []:
            if e.get("_id") == doc.get("_id"):
                return e.get("cc") or None
    return doc.get("cc") or None


def quiet_as(doc: Mapping[str, Any]) -> Optional[float]:
    """The `quiet` a fold gives a document (core.stuck): its `updated_at` while it is RUNNING
    and waits on nothing (no pending entry, no timer bound, not a tombstone), else none."""
    at = doc.get("updated_at")
    waits = doc.get("pending") or "next_fire" in doc or "tomb" in doc
    if doc.get("status") != "RUNNING" or waits or not _number(at):
        return None
    return float(at)


def _quiet(doc: dict[str, Any], quiet: Optional[float]) -> None:
    if quiet is None:
        doc.pop("quiet", None)
    else:
        doc["quiet"] = quiet


def _mark(exes: dict[Any, dict[str, Any]], part: int, seq: int, entries: list[dict[str, Any]]) -> None:
    """Each document of a batch marked with what it was counted as; on a quiet database it
    is still as the batch read it, so it is clean again."""
    for e in entries:
        d = exes.get(e["_id"])
        if d is None or d.get("part") != part or int(d.get("cseq") or 0) >= seq:
            continue
        d["cc"], d["cseq"] = e["cc"], seq
        d.pop("cdirty", None)
        _quiet(d, quiet_as(d))  # as read: on a quiet database the document did not move


def counts_read(before: Snapshot, dirty_limit: int = 500) -> tuple[Snapshot, bool]:
    """What a query that reads the counts writes: a fold of the built partitions when more
    than a batch of their documents is dirty, else nothing; never a build (a counter not
    built yet is left to the workers and `migrate up`: the counts say it is missing).
    Returns whether it folded."""
    counts = before.get(COUNTS, {})
    built = [p for p in range(PARTS) if counts.get(p, {}).get("built")]
    dirty = sum(1 for d in before.get(EXES, {}).values() if d.get("cdirty") is True and d.get("part") in built)
    if dirty <= dirty_limit:
        return before, False
    return fold(before, built, None)[0], True


def finite(v: Any) -> bool:
    return _number(v) and math.isfinite(v)


# --- the transport's writes (transport/queues.py, Rules 1-6, restated) ----------------------------

INLINE_MAX, INLINE_BYTES = 64, 256 * 1024
#: an overflow document's `_id`: a driver-made ObjectId, increasing in publish order
OVERFLOW_ID = Drawn("overflow id", lambda v: type(v).__name__ == "ObjectId", "bson.ObjectId(), made by the driver")
#: an ack's `touched`: `$currentDate`, the server's own clock (no seam to pin)
SERVER_TIME = Drawn("server time", lambda v: isinstance(v, datetime), "$currentDate: the server's clock")


def _drained(q: Mapping[str, Any]) -> bool:
    return int(q.get("pending") or 0) <= 0 and q.get("token") is None


def _queue_write(q: dict[str, Any], priority: int, adds: Mapping[str, int], now: float) -> None:
    """A publish's write: a new group's defaults, the priority of a drained group, a drained
    (or new) group's key in the fresh band (the publish time less `FRESH_OFFSET`), counts added."""
    drained = _drained(q)
    keep_priority = not drained and "priority" in q
    q["available_at"] = now - FRESH_OFFSET if drained else q.get("available_at", now)
    for k, v in {"token": None, "acked": 0, "spill": False}.items():
        q.setdefault(k, v)
    if not keep_priority:
        q["priority"] = priority
    for k, n in adds.items():
        q[k] = int(q.get(k) or 0) + n


def publish(before: Snapshot, group_id: str, text: str, priority: int, now: float) -> Snapshot:
    """The message appended inline while the group has room and does not spill, else an
    overflow document and the group told (the spill started if it was not)."""
    after = copy.deepcopy(before)
    queues = after.setdefault(QUEUES, {})
    size = len(text.encode())
    q = queues.get(group_id)
    # the room filter's operators match no missing count (a group a spill created has none)
    room = q is None or (
        q.get("spill") is not True
        and _number(q.get("qn"))
        and q["qn"] < INLINE_MAX
        and _number(q.get("qb"))
        and q["qb"] <= INLINE_BYTES - size
    )
    part = part_of(group_id)
    if size <= INLINE_BYTES and room:
        q = queues.setdefault(group_id, {"_id": group_id})
        _queue_write(q, priority, {"qn": 1, "qb": size, "pending": 1, "published": 1, "wake": 1}, now)
        q["q"] = list(q.get("q") or []) + [{"e": text}]
        q["part"] = part
        return after
    after.setdefault(OVERFLOW, {})[OVERFLOW_ID] = {"_id": OVERFLOW_ID, "g": group_id, "e": text, "part": part}
    if q is not None and q.get("spill") is True:
        for k in ("spilled", "published", "wake"):
            q[k] = int(q.get(k) or 0) + 1
        return after
    q = queues.setdefault(group_id, {"_id": group_id})
    _queue_write(q, priority, {"spilled": 1, "published": 1, "wake": 1, "pending": 1}, now)
    q.update(spill=True, part=part)
    return after


def claim(
    before: Snapshot, now: float, until: float, min_priority: int, token: Optional[str]
) -> tuple[Snapshot, Optional[tuple[str, str]]]:
    """The due group first in the claim order (the lowest key: the fresh band's are below the
    served band's) leased (`token`: the lease's, as the claim answered it; a group found with
    nothing to deliver is reset and the next one tried), and what it delivers: (group,
    message text) or None."""
    after = copy.deepcopy(before)
    queues, overflow = after.get(QUEUES, {}), after.get(OVERFLOW, {})
    for _ in range(8):
        due = [
            q
            for q in queues.values()
            if int(q.get("pending") or 0) > 0
            and q.get("available_at", 0) <= now
            and q.get("priority", 0) >= min_priority
        ]
        if not due:
            return after, None
        q = min(due, key=lambda q: (q.get("available_at", 0), q["_id"]))
        q["token"], q["available_at"] = token, until
        if q.get("q"):
            return after, (q["_id"], q["q"][0]["e"])
        spilled = sorted((o for o in overflow.values() if o.get("g") == q["_id"]), key=lambda o: o["_id"])
        if spilled:
            spilled[0]["tok"] = token
            return after, (q["_id"], spilled[0]["e"])
        q.update(pending=0, qn=0, qb=0, spill=False, token=None, available_at=now)
    return after, None


def ack_message(before: Snapshot, group_id: str, token: str, overflow_id: Any, size: int, now: float) -> Snapshot:
    """The head gone (popped inline, or its overflow document deleted) and the group freed,
    each only while the lease's token holds it."""
    after = copy.deepcopy(before)
    q = after.get(QUEUES, {}).get(group_id)
    if overflow_id is not None:
        o = after.get(OVERFLOW, {}).get(overflow_id)
        if o is not None and o.get("g") == group_id and o.get("tok") == token:
            del after[OVERFLOW][overflow_id]
    if q is None or q.get("token") != token:
        return after
    if overflow_id is None:
        q["q"] = list(q.get("q") or [])[1:]
        for k, n in {"qn": -1, "qb": -size, "pending": -1}.items():
            q[k] = int(q.get(k) or 0) + n
    for k in ("acked", "wake"):
        q[k] = int(q.get(k) or 0) + 1
    q.update(token=None, available_at=now, touched=SERVER_TIME)
    return after


def nack_message(before: Snapshot, group_id: str, token: str, delay: float, now: float) -> Snapshot:
    """Parked until `now + delay` (the lease kept), or given back at once."""
    after = copy.deepcopy(before)
    q = after.get(QUEUES, {}).get(group_id)
    if q is None or q.get("token") != token:
        return after
    if delay > 0:
        q["available_at"] = now + delay
    else:
        q.update(available_at=now, token=None, wake=int(q.get("wake") or 0) + 1)
    return after


# --- the layout migrations' later steps (migrate/pending_flag.py: 2, migrate/partitions.py: 3,
# migrate/lean_indexes.py: 4, which changes indexes only: no document, no counter but the marker) --

MARKER = "harel_beanie:schema"


def migrate_down_to_1(before: Snapshot) -> Snapshot:
    """Down from layout 4 to 1: `part` gone from every document (executions, queues,
    overflow), the counts gone (their collection, and the marks of every document a fold or
    a build marked: `cc` and what goes with it), `pending` gone, version 1 recorded."""
    after = copy.deepcopy(before)
    after.pop(COUNTS, None)
    for coll in (EXES, QUEUES, OVERFLOW):
        for doc in after.get(coll, {}).values():
            doc.pop("part", None)
    for doc in after.get(EXES, {}).values():
        for k in ("cc", "cseq", "cdirty", "leaving", "quiet"):  # every mark of the counts' fold
            doc.pop(k, None)
        doc.pop("pending", None)
    after[COUNTERS][MARKER]["n"] = 1
    return after


def migrate_up_from_1(before: Snapshot) -> Snapshot:
    """Up from layout 1 to 4: `pending` exactly where entries are, `part` on every execution,
    queue and overflow document (from its id, or its group's), version 4 recorded (and the
    count of partitions where none is), then the counts built."""
    after = copy.deepcopy(before)
    for doc in after.get(EXES, {}).values():
        with_pending(doc)
        doc["part"] = part_of(doc["_id"])
    for doc in after.get(QUEUES, {}).values():
        if doc.get("part") is None:
            doc["part"] = part_of(doc["_id"])
    for doc in after.get(OVERFLOW, {}).values():
        if doc.get("part") is None:
            doc["part"] = part_of(doc["g"])
    marker = after[COUNTERS][MARKER]
    marker["n"] = 4
    marker.setdefault("parts", PARTS)
    # and, at this package's layout, every partition's counter built (migrate.counts_build)
    exes, counts = after.setdefault(EXES, {}), after.setdefault(COUNTS, {})
    unbuilt = [p for p in range(PARTS) if not counts.get(p, {}).get("built")]
    _fresh_counters(after, unbuilt)
    for part in unbuilt:
        _build(exes, counts, part)
    return after


def due_timers(before: Snapshot, now: float) -> Snapshot:
    """The timer sweep's one write: a document its bound brought in (`next_fire` at or
    before `now`) with no timer due has a stale bound (a cancelled timer's), raised to its
    earliest timer, or dropped if none is left."""
    after = copy.deepcopy(before)
    for doc in after.get(EXES, {}).values():
        bound = doc.get("next_fire")
        if not _number(bound) or bound > now:
            continue
        timers = doc.get("timers") or {}
        if any(at <= now for at in timers.values()):
            continue
        earliest = min(timers.values(), default=None)
        if earliest is None:
            doc.pop("next_fire")
        elif earliest != bound:
            doc["next_fire"] = earliest
        doc["cdirty"] = True  # without its bound it may wait on nothing: the fold decides
    return after
