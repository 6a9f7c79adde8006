"""What kind of work a command sent to the server is, read from its shape alone: the collection
it addresses, the command's name, and the fields its filter and update name. The per-event cost
table (bench/common/cost.py) sums the commands and their wire time by these kinds, for harel's
store and transport and for this package's alike, so the kinds are defined once, here, and
tested on command shapes captured from real runs (tests/package/test_bench_cost.py).

The kinds:

- `claim`: leasing a message (harel's `findAndModify` on its locks and the head read; this
  transport's window read of the claim key and its conditional lease update);
- `load`: reading an execution to handle an event (`load`, `load_for_event`, `is_processed`);
- `commit`: writing an execution (insert, the version-checked update, its read-back, harel's
  trace counter and trace push, the kept starts);
- `ack`: releasing a handled message (and a nack, which is rare here);
- `publish`: queueing a message (harel's sequence counter, message insert and group upsert;
  this transport's one upsert; a spilled message);
- `relay`: the store's pending outbox entries and spawns, read and marked sent (the publish the
  relay makes is a `publish`);
- `sweep`: timers, read when due and removed when fired, and the next timer's time;
- `fold`: the status counts (`<prefix>_hb_counts`) and the executions' marks they fold;
- `sample`: the minute samples (`<prefix>_hb_samples`) and the figures read for them or for a
  worker's start (a count of the executions or of the queued messages, the oldest pending
  entry, the next timers: every aggregation but harel's `load_for_event`); the sample's read of
  the status counts is the fold's read of them, and is counted as `fold`;
- `lease`: the workers' partition leases (`<prefix>_hb_partitions`);
- `observer`: the benchmark's own reads (sent with `comment=OBSERVER`), counted apart so that
  the stack is not charged for them;
- `other`: anything else (set-up, the schema marker, index builds, drops, session ends, and a
  `getMore`: a read's next batch, whose shape does not say which read it continues).

A shape is classified by its collection first: every collection but the executions serves one
kind of work (or, for harel's transport, a few told apart by the command). The executions are
read and written by several, told apart by the fields the filter or update names. A shape this
module does not know is `other`, never guessed: the table shows how many there were.
"""

from __future__ import annotations

from typing import Any, Mapping

KINDS = ("claim", "load", "commit", "ack", "publish", "relay", "sweep", "fold", "sample", "lease")
#: kinds outside the stack's own work, listed after KINDS in a table
EXTRA = ("observer", "other")
ALL = KINDS + EXTRA
#: the comment the benchmark's own reads carry, so that they are counted as `observer`
OBSERVER = "hbbench-observer"

# the commands whose first field names no collection
_NO_COLLECTION = {"getMore": "collection"}


def collection_of(name: str, command: Mapping[str, Any]) -> str | None:
    """The collection a command addresses, or None (e.g. `ping`, `hello`)."""
    target = command.get(_NO_COLLECTION.get(name, name))
    return target if isinstance(target, str) else None


def _filters(name: str, command: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The filters a command carries: a read's filter, each update's or delete's `q`, a
    findAndModify's query, an aggregation's first `$match`."""
    if name in ("find", "count"):
        found = command.get("filter") or command.get("query") or {}
        return [found] if isinstance(found, Mapping) else []
    if name in ("update", "delete"):
        key = "updates" if name == "update" else "deletes"
        return [op.get("q") or {} for op in command.get(key) or () if isinstance(op, Mapping)]
    if name.lower() == "findandmodify":
        return [command.get("query") or {}]
    if name == "aggregate":
        stages = command.get("pipeline") or []
        first = stages[0] if stages and isinstance(stages[0], Mapping) else {}
        match = first.get("$match")
        return [match] if isinstance(match, Mapping) else []
    return []


def _updates(command: Mapping[str, Any]) -> list[Any]:
    """The update documents (or pipelines) of an `update` command."""
    return [op.get("u") for op in command.get("updates") or () if isinstance(op, Mapping)]


def _fields(docs: list[Mapping[str, Any]]) -> set[str]:
    """Every field a list of filters names at its top level (`$and`/`$or` looked into)."""
    out: set[str] = set()
    for doc in docs:
        for key, value in doc.items():
            if key in ("$and", "$or", "$nor") and isinstance(value, list):
                out |= _fields([v for v in value if isinstance(v, Mapping)])
            else:
                out.add(key)
    return out


def _updated_fields(updates: list[Any]) -> set[str]:
    """The fields an update's operators name (`$set`, `$unset`, ...); a pipeline's `$set`
    stages likewise."""
    out: set[str] = set()
    for u in updates:
        stages = u if isinstance(u, list) else [u]
        for stage in stages:
            if not isinstance(stage, Mapping):
                continue
            for op, body in stage.items():
                if isinstance(body, Mapping):
                    out |= set(body)
                elif op and not op.startswith("$"):
                    out.add(op)
    return out


def _root(field: str) -> str:
    return field.split(".", 1)[0]


def classify(name: str, command: Mapping[str, Any]) -> str:
    """The kind of work (one of ALL) of command `name` with body `command` (as PyMongo's
    CommandStartedEvent gives them)."""
    if command.get("comment") == OBSERVER:
        return "observer"
    coll = collection_of(name, command)
    if coll is None:
        return "other"
    if coll.endswith("_hb_partitions"):
        return "lease"
    if coll.endswith("_hb_counts"):
        return "fold"
    if coll.endswith("_hb_samples"):
        return "sample"
    if coll.endswith("_hb_starts"):
        return "commit"
    if coll.endswith(("_hb_queues", "_hb_overflow")):
        return _queue(name, command)
    if coll.endswith(("_transport_messages", "_transport_locks", "_transport_counters", "_transport_groups")):
        return _harel_transport(name, coll, command)
    if coll.endswith("_executions"):
        return _executions(name, command)
    if coll.endswith("_counters"):
        # the sequences a commit mints (harel's trace steps; this store's outbox and spawn seqs,
        # leased in blocks), apart from this store's schema marker, read at start
        marker = any(str(f.get("_id", "")).startswith("harel_beanie:schema") for f in _filters(name, command))
        return "other" if marker else "commit"
    return "other"


def _queue(name: str, command: Mapping[str, Any]) -> str:
    """This package's queue and overflow collections: one upsert publishes, a window read and a
    conditional update claim, an update holding the lease's token acks (or nacks)."""
    if name in ("aggregate", "count"):
        return "sample"  # how many messages wait: a figure for the operator, not a claim
    if name == "find":
        return "claim"
    if name == "insert":
        return "publish"  # a spilled message, written beside its group
    if name == "delete":
        return "ack"
    if name != "update":
        return "other"
    ops = [op for op in command.get("updates") or () if isinstance(op, Mapping)]
    if any(op.get("upsert") for op in ops):
        return "publish"
    q = _fields(_filters(name, command))
    if "token" in q and "pending" in q:
        return "claim"  # the lease: still unleased (`token: None`) at the head the window read
    if "token" in q:
        return "ack"
    return "publish" if "qb" in q or "qn" in q else "other"


def _harel_transport(name: str, coll: str, command: Mapping[str, Any]) -> str:
    """harel's AsyncMongoTransport: a counter, the messages and one lock document per group."""
    if coll.endswith("_transport_counters") or name == "insert":
        return "publish"
    if name not in ("find", "findAndModify", "findandmodify", "update", "delete"):
        return "other"  # a count at a worker's start, an index build
    if coll.endswith("_transport_messages"):
        if name == "find" and command.get("sort"):
            return "claim"  # the claimed group's head, oldest first
        return "ack"  # the handled message deleted, and whether its group holds another
    if name.lower() == "findandmodify":
        return "ack" if command.get("remove") else "claim"
    if name == "update":
        if any("$setOnInsert" in (u or {}) for u in _updates(command) if isinstance(u, Mapping)):
            return "publish"  # a new group readied (also a drained group re-readied, rarely)
        return "ack"
    return "ack" if name == "find" else "other"  # the ack's check that the lease is still held


#: fields of the executions whose presence in a filter or update says which work it is
_RELAY = {"pending", "outbox", "spawns"}
_SWEEP = {"timers", "next_fire"}
_FOLD = {"cdirty", "cseq", "tomb", "born"}  # a commit's filter names none of these


def _executions(name: str, command: Mapping[str, Any]) -> str:
    """The executions: loads and commits by `_id`, the relay's and the sweep's reads and marks,
    the counts' fold. A commit checks `version`; a mark of a relayed entry names its `seq`."""
    filters = _filters(name, command)
    q = {_root(f) for f in _fields(filters)}
    if name == "insert":
        return "commit"
    if name == "update":
        fields = _fields(filters)
        if any(f.endswith(".seq") for f in fields):
            return "relay"  # an outbox entry or a spawn marked sent
        written = {_root(f) for f in _updated_fields(_updates(command))}
        if q & _FOLD:
            return "fold"  # the fold's mark, checked against the version it read
        if "version" in q:
            return "commit"
        if written & {"cdirty", "cseq", "cc"}:
            return "fold"
        if q & _SWEEP or written & {"timers", "next_fire"}:
            return "sweep"
        return "commit" if written & {"trace"} else "other"  # harel's trace step push
    if name in ("find", "aggregate", "count"):
        projection = command.get("projection") or {}
        if q == {"_id"} or q == {"_id", "processed"}:
            if set(projection) == {"version"}:
                return "commit"  # a commit's read-back after a lost reply or a conflict
            return "load"
        if q & _FOLD:
            return "fold"
        if name in ("aggregate", "count"):
            return "sample"  # a figure for the operator: a count, the oldest pending entry
        if q & _RELAY:
            return "relay"
        if q & _SWEEP:
            # the next timers with their models are the operator's figure; the sweep reads times
            return "sample" if "definition_id" in projection else "sweep"
    return "other"
