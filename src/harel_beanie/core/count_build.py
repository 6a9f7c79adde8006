"""A partition counter's build, with no I/O: the server-side updates giving the documents
their `cc` and raising older marks to the counter's epoch, and the sums a batch adds to its
counter (`harel_beanie.core.counting` states the rules: its last paragraph, and Rule 6).

Why this module exists: the build is the counts' one pass over every execution, and its
pieces are apart from the fold's so each module reads at a glance.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from harel_beanie.core.counting import COUNTED, COUNTED_SEQ, LEAVING, LOW, NO_ID, UNKNOWN, definition_key, status_key
from harel_beanie.core.stuck import QUIET, quiet_expression

#: the document of harel's counters collection numbering the counters' epochs (Rule 6), and
#: the seqs one epoch spans: 2**40 folds of one partition, beyond any database's life
EPOCH_ID, EPOCH_SPAN = "hb_counts_epoch", 2**40


def epoch_base(epoch: int) -> int:
    """The first seq of counters of `epoch` (Rule 6)."""
    return epoch * EPOCH_SPAN


def _base_expression(bases: Mapping[int, int]) -> Any:
    """Each document's partition's counter base (Rule 6), as a server-side expression."""
    values = set(bases.values())
    if len(values) == 1:
        return values.pop()
    out: Any = 0
    for part, base in sorted(bases.items()):
        out = {"$cond": [{"$eq": ["$part", part]}, base, out]}
    return out


def raise_seq(bases: Mapping[int, int]) -> list[dict[str, Any]]:
    """The update raising a document's `cseq` to its counter's base (Rule 6)."""
    return [{"$set": {COUNTED_SEQ: {"$max": [f"${COUNTED_SEQ}", _base_expression(bases)]}}}]


def build_pipeline(bases: Optional[Mapping[int, int]] = None) -> list[dict[str, Any]]:
    """The update giving a document not yet counted its `cc` from its own fields (Rule 1),
    as `state_of` computes it, on the server, marked by its partition's counter base
    (`bases`, Rule 6)."""
    live = {
        "d": "$definition_id",
        "s": {"$ifNull": ["$status", UNKNOWN]},
    }
    state = {
        "$cond": [
            {"$eq": [f"${LEAVING}", True]},
            None,
            {"$cond": [{"$eq": [{"$type": "$tomb"}, "object"]}, {"t": 1}, live]},
        ]
    }
    base = _base_expression(bases) if bases else 0
    return [{"$set": {COUNTED: state, COUNTED_SEQ: base, QUIET: quiet_expression()}}]


def build_sums(parts: list[int], ids: Optional[dict[str, Any]] = None) -> list[dict[str, Any]]:
    """The aggregation summing the `cc` of each of `parts` (of its documents whose `_id`
    matches `ids`: one build batch), one group per partition, definition and status: one
    read for every partition being built, where one read per partition would read the
    collection once each on a server with no index led by `part` alone."""
    match: dict[str, Any] = {"part": parts[0] if len(parts) == 1 else {"$in": parts}, COUNTED: {"$type": "object"}}
    if ids is not None:
        match["_id"] = ids
    return [
        {"$match": match},
        {
            "$group": {
                "_id": {"p": "$part", "d": f"${COUNTED}.d", "s": f"${COUNTED}.s"},
                "n": {"$sum": 1},
                "t": {"$sum": {"$ifNull": [f"${COUNTED}.t", 0]}},
                LOW: {"$min": "$_id"},
            }
        },
    ]


def sums_by_part(groups: list[Mapping[str, Any]], parts: list[int]) -> dict[int, list[Mapping[str, Any]]]:
    """`build_sums`' groups, per partition (every one of `parts`, an empty one too)."""
    out: dict[int, list[Mapping[str, Any]]] = {p: [] for p in parts}
    for g in groups:
        part = (g.get("_id") or {}).get("p")
        if part in out:
            out[part].append(g)
    return out


def built_counter(groups: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The `$set` of a partition's counter from `build_sums`' groups."""
    n: dict[str, dict[str, int]] = {}
    t = 0
    low = NO_ID
    for g in groups:
        t += int(g.get("t") or 0)
        if isinstance(g.get(LOW), str):
            low = min(low, g[LOW])
        key = g.get("_id") or {}
        if key.get("d") is not None and key.get("s") is not None:
            per = n.setdefault(definition_key(str(key["d"])), {})
            per[status_key(str(key["s"]))] = int(g["n"])
    return {"n": n, "t": t, LOW: low, "built": True}


def batch_increment(groups: list[Mapping[str, Any]]) -> tuple[dict[str, int], str]:
    """A build batch's `$inc` of its partition's counter from `build_sums`' groups, and the
    batch's smallest id (`NO_ID`: none) for the counter's `$min` of `low`."""
    sums = built_counter(groups)
    inc = {"t": sums["t"]} if sums["t"] else {}
    for dkey, per in sums["n"].items():
        for skey, n in per.items():
            inc[f"n.{dkey}.{skey}"] = n
    return inc, sums[LOW]
