"""Which index each read the package sends can use: the query shapes recorded on the wire,
matched against every index's key and partial filter, for docs/INDEXES.md and its test.

A query can use an index when two things hold, as for any MongoDB planner:

- its filter implies the index's partial filter (a document the query selects has a key
  there), and
- its filter's conditions on the key's leading fields are equalities (an `$in` counts) and
  at most one range, in the key's order, at least one of them: the fields form a prefix of
  the key, so the index bounds the read.

Only the filter a command selects by is read: a `find`'s, a `count`'s or `distinct`'s
query, an `aggregate`'s first `$match`, a `findAndModify`'s query, each statement of an
`update` or `delete`. A top-level `$and` is merged; an `$or` (or `$nor`) shape is kept whole
and uses an index only when every branch uses it. `Recorder` keeps the commands with the
operation that sent them (`tests.sharding.audit.OP`).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from pymongo import IndexModel, monitoring

from tests.sharding.audit import OP

#: the commands that select documents by a filter, and how to get it (and a sort) from them
READS = ("find", "count", "distinct", "aggregate", "findAndModify", "update", "delete")

_RANGE_OPS = {"$gt", "$gte", "$lt", "$lte", "$regex"}


@dataclass(frozen=True)
class Index:
    """One index of one collection (`collection` without the prefix)."""

    collection: str
    name: str
    key: tuple[tuple[str, Any], ...]
    partial: Optional[Mapping[str, Any]] = None
    ttl: Optional[int] = None
    unique: bool = False
    sparse: bool = False

    @classmethod
    def of(cls, collection: str, spec: Mapping[str, Any]) -> "Index":
        return cls(
            collection,
            spec["name"],
            tuple((str(k), v) for k, v in dict(spec["key"]).items()),
            spec.get("partialFilterExpression"),
            spec.get("expireAfterSeconds"),
            bool(spec.get("unique")),
            bool(spec.get("sparse")),
        )

    @classmethod
    def model(cls, collection: str, ix: IndexModel) -> "Index":
        return cls.of(collection, ix.document)

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(f for f, _ in self.key)

    def describe(self) -> str:
        key = ", ".join(f if d == 1 else f"{f} {d}" for f, d in self.key)
        out = f"({key})"
        if self.partial:
            out += f" where {_filter_text(self.partial)}"
        if self.ttl is not None:
            out += f", TTL {self.ttl} s"
        if self.unique:
            out += ", unique"
        if self.sparse:
            out += ", sparse"
        return out


@dataclass(frozen=True)
class Query:
    """One filter a command selected by, as sent: its collection (without the prefix), the
    command, the operation that sent it, the filter and the sort."""

    collection: str
    command: str
    op: str
    filter: Mapping[str, Any]
    sort: tuple[str, ...] = ()

    def shape(self) -> str:
        """The filter with its values elided (a partial filter's constants kept)."""
        text = f"{self.command} {_shape(self.filter)}"
        return text + (f" sort {', '.join(self.sort)}" if self.sort else "")


def _filter_text(f: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {_cond_text(v)}" for k, v in f.items())


def _cond_text(v: Any) -> str:
    if isinstance(v, Mapping):
        return " ".join(f"{op} {_value(x)}" for op, x in v.items())
    return f"= {_value(v)}"


def _value(x: Any) -> str:
    if isinstance(x, float) and math.isinf(x):
        return "-inf" if x < 0 else "inf"
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, list):
        return "[" + ", ".join(_value(i) for i in x) + "]"
    return repr(x)


def _shape(f: Mapping[str, Any]) -> str:
    parts = []
    for k, v in f.items():
        if k in ("$or", "$nor", "$and"):
            parts.append(f"{k}: [" + " | ".join(_shape(b) for b in v) + "]")
        elif isinstance(v, Mapping):
            ops = []
            for op, x in v.items():
                constant = isinstance(x, bool) or (isinstance(x, float) and math.isinf(x)) or x is None
                ops.append(f"{op} {_value(x)}" if constant else op)
            parts.append(f"{k}: {' '.join(ops)}")
        elif isinstance(v, bool) or v is None:
            parts.append(f"{k}: {_value(v)}")
        else:
            parts.append(f"{k}: =")
    return "{" + ", ".join(parts) + "}"


# --- a query against an index ---------------------------------------------------------------


def _conditions(f: Mapping[str, Any]) -> dict[str, list[Any]]:
    """field -> its conditions, a top-level `$and` merged in."""
    out: dict[str, list[Any]] = {}
    for k, v in f.items():
        if k == "$and":
            for branch in v:
                for bk, bv in _conditions(branch).items():
                    out.setdefault(bk, []).extend(bv)
        elif not k.startswith("$"):
            out.setdefault(k, []).append(v)
    return out


def _is_equality(c: Any) -> bool:
    if not isinstance(c, Mapping):
        return True
    return bool(c) and all(op in ("$eq", "$in") for op in c)


def _is_range(c: Any) -> bool:
    return isinstance(c, Mapping) and any(op in _RANGE_OPS for op in c)


def _values(c: Any) -> Optional[list[Any]]:
    """The values an equality condition allows (None: not an equality)."""
    if not isinstance(c, Mapping):
        return [c]
    if "$eq" in c:
        return [c["$eq"]]
    if "$in" in c:
        return list(c["$in"])
    return None


def _lower(c: Any) -> Optional[tuple[float, bool]]:
    """The lower bound a condition puts on a number, and whether it is strict (None: none)."""
    values = _values(c)
    if values is not None:
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return (min(nums), False) if nums and len(nums) == len(values) else None
    if isinstance(c, Mapping):
        bounds = [(c[op], op == "$gt") for op in ("$gt", "$gte") if isinstance(c.get(op), (int, float))]
        return max(bounds) if bounds else None
    return None


def _implies(conds: list[Any], wanted: Any) -> bool:
    """Whether a field's conditions (all holding) imply the partial filter's condition."""
    if isinstance(wanted, Mapping) and set(wanted) <= {"$gte", "$gt"}:
        strict = "$gt" in wanted
        low = wanted["$gt"] if strict else wanted["$gte"]
        for c in conds:
            bound = _lower(c)
            if bound is not None and (bound[0] > low or (bound[0] == low and (bound[1] or not strict))):
                return True
        return False
    if isinstance(wanted, Mapping) and "$in" in wanted:
        allowed = list(wanted["$in"])
        return any((vs := _values(c)) is not None and all(v in allowed for v in vs) for c in conds)
    if isinstance(wanted, Mapping) and wanted == {"$exists": True}:
        return any(_values(c) not in (None, [None]) or _is_range(c) for c in conds)
    target = wanted["$eq"] if isinstance(wanted, Mapping) and "$eq" in wanted else wanted
    return any((vs := _values(c)) is not None and vs and all(v == target for v in vs) for c in conds)


def bounded_fields(index: Index, query: Query) -> int:
    """How many of the index's leading fields the query's filter bounds (equalities, then at
    most one range); 0 when the query can't use it, or its filter misses the partial filter."""
    if "$or" in query.filter or "$nor" in query.filter:
        branches = query.filter.get("$or") or []
        rest = {k: v for k, v in query.filter.items() if k not in ("$or", "$nor")}
        if "$nor" in query.filter or not branches:
            return bounded_fields(index, Query(query.collection, query.command, query.op, rest, query.sort))
        # an $or uses the index when every branch (with the rest of the filter) does
        each = [
            bounded_fields(index, Query(query.collection, query.command, query.op, {**rest, **b}, query.sort))
            for b in branches
        ]
        whole = bounded_fields(index, Query(query.collection, query.command, query.op, rest, query.sort))
        return max(min(each), whole)
    conds = _conditions(query.filter)
    for f, wanted in (index.partial or {}).items():
        if not _implies(conds.get(f, []), wanted):
            return 0
    n = 0
    for f in index.fields:
        here = conds.get(f, [])
        if here and all(_is_equality(c) for c in here):
            n += 1
            continue
        if any(_is_range(c) or _is_equality(c) for c in here):
            n += 1
        break
    return n


def by_id(query: Query) -> bool:
    """Whether the filter names its documents by `_id` (an equality or an `$in`): the `_id`
    index's read, whatever else it names."""
    return any(_is_equality(c) for c in _conditions(query.filter).get("_id", []))


def sort_follows(index: Index, query: Query) -> bool:
    """Whether the query's sort is the index's order after the fields its filter fixes by
    equality: the index gives the order too, no sort is left to do."""
    if not query.sort:
        return False
    conds = _conditions(query.filter)
    fixed = 0
    for f in index.fields:
        here = conds.get(f, [])
        if not (here and all(_is_equality(c) for c in here)):
            break
        fixed += 1
    return index.fields[fixed : fixed + len(query.sort)] == query.sort


# --- the wire --------------------------------------------------------------------------------


def queries_of(command_name: str, command: Mapping[str, Any], op: str, strip: str) -> list[Query]:
    """The filters one recorded command selected by (`strip`: the collections' prefix)."""
    if command_name not in READS:
        return []
    coll = command.get(command_name)
    if not isinstance(coll, str):
        return []
    coll = coll.removeprefix(strip)
    if command_name == "find":
        return [Query(coll, "find", op, command.get("filter") or {}, tuple(dict(command.get("sort") or {})))]
    if command_name in ("count", "distinct"):
        return [Query(coll, command_name, op, command.get("query") or {})]
    if command_name == "findAndModify":
        return [Query(coll, "findAndModify", op, command.get("query") or {}, tuple(dict(command.get("sort") or {})))]
    if command_name == "update":
        return [Query(coll, "update", op, u.get("q") or {}) for u in command.get("updates", [])]
    if command_name == "delete":
        return [Query(coll, "delete", op, d.get("q") or {}) for d in command.get("deletes", [])]
    pipeline = list(command.get("pipeline") or [])
    first = pipeline[0].get("$match") if pipeline and "$match" in pipeline[0] else None
    sort: tuple[str, ...] = ()
    if first is not None and len(pipeline) > 1 and "$sort" in pipeline[1]:
        sort = tuple(dict(pipeline[1]["$sort"]))
    return [Query(coll, "aggregate", op, first or {}, sort)]


@dataclass
class Recorder(monitoring.CommandListener):
    """The filters of every command sent on database `db_name`, with the operation (the
    `OP` of the task or thread that sent it), and the indexes the code asked to create."""

    db_name: str
    prefix: str = "harel_"
    queries: list[Query] = field(default_factory=list)
    created: list[Index] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.database_name != self.db_name:
            return
        command = dict(event.command)
        op = OP.get() or "(none)"
        found = queries_of(event.command_name, command, op, self.prefix)
        made = []
        if event.command_name == "createIndexes":
            coll = str(command["createIndexes"]).removeprefix(self.prefix)
            made = [Index.of(coll, spec) for spec in command.get("indexes", [])]
        with self._lock:
            self.queries.extend(found)
            self.created.extend(made)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


# --- what a document costs the indexes -------------------------------------------------------


def _path_values(doc: Any, path: str) -> list[Any]:
    head, _, rest = path.partition(".")
    value = doc.get(head) if isinstance(doc, Mapping) else None
    if isinstance(value, list):
        return [v for item in value for v in (_path_values(item, rest) if rest else [item])] or [None]
    if rest:
        return _path_values(value, rest) if isinstance(value, Mapping) else [None]
    return [value]


def holds_key(doc: Mapping[str, Any], index: Index) -> bool:
    """Whether `doc` has a key in `index` (its partial filter, or sparse, admit it)."""
    for f, wanted in (index.partial or {}).items():
        present = [v for v in _path_values(doc, f) if v is not None]
        if not _implies([v for v in present], wanted):
            return False
    if index.sparse and all(v is None for f in index.fields for v in _path_values(doc, f)):
        return False
    return True
