"""Execution counts kept up to date: what each execution is counted as, and how a partition's
counter document moves, with no I/O (the flows in `harel_beanie.core.flows.counting` send it).

Why this module exists: counting executions per status over the whole collection costs
O(executions) on every server, for every page view and scrape. Instead each partition has one
counter document (`CountsDocument`) and every execution document says what it is counted as.
The rules, each write keeping them in the one update it already makes:

Rule 1. An execution document holds `cc`, what the counters count it as: `{d, s}` (its
        definition and status) for an execution, `{t: 1}` for a tombstone, null for
        nothing; `cseq`, the batch that last set `cc` (Rule 3). `cc` is meaningful only
        with `cseq`: a document never folded has neither, and the counters may count it
        (Rule 4's `last`) although it carries no `cc`. `state_of` is what it should be
        counted as now: a document that prune has begun removing (`leaving`) counts as
        nothing. The version is not counted: a `cc` written before this rule may still
        carry a `v` (and a counter a `v` sum), which every delta and reader ignores, so an
        old database counts right with no migration (tests/store/test_counts.py).
Rule 2. Every write that creates a document or may change what it is counted as (a commit
        that may change its status, definition or leaving mark, the creation over a
        tombstone, a purge, prune's `leaving` mark) also sets `cdirty`, in the same update,
        as does every write that may make an execution wait on nothing (an ack, a timer's
        removal or the repair of its bound: the fold decides its `quiet`, `core.stuck`). A
        commit that provably changes none of them does not: its filter pins the stored
        status, definition and the absence of a leaving mark to what it writes (the
        version alone pins the document, these make "unchanged" a fact the server checks,
        not a hint believed), and it sets or clears `quiet` itself (`core.stuck`,
        `core.commit`). So the counts, the folds and the exact reads follow status
        changes, not events. The partial index `hb_part_cdirty` holds only the dirty
        documents.
        A purge and a creation over a tombstone carry `cc` and `cseq` on to the document
        that replaces the old one (guarded on them), so what the counters count an id as
        moves with it; together they form the id's counted lineage, which ends only when
        prune deletes the id (Rule 5).
Rule 3. A fold applies the deltas (`state_of` less what the counters count it as) of a batch
        of dirty documents to the counter document in one update, conditional on its `seq`,
        which the update raises and which records the batch (`last`: each id, what it is
        now counted as, and what pins the state read and the lineage): two folders cannot
        both apply a batch. Then it marks each document of the batch (`cc` and `cseq` set;
        `quiet` set or cleared and `cdirty` cleared only if the document is still as read,
        its pending flag and timer bound too, so a commit, an ack or a timer's removal in
        between leaves it dirty). A mark carries its batch's seq and lands only on a
        document of the lineage read (`lineage`: the incarnation read, or one a purge or a
        creation over a tombstone carried on from it) last marked by an earlier batch or
        never (`cseq` below it or absent): a late folder cannot undo a later batch's mark,
        nor mark an id created again after prune deleted it. A fold that died between the
        two finds `last` unmarked and marks it first, before it reads the dirty documents.
Rule 4. Exact counts at any moment are the counter documents plus, for each dirty document,
        its `state_of` less what the counters hold for it: while its batch is the last one
        and not yet marked on it, that batch's entry, else its `cc` (`effective_cc`). A
        clean document is counted as its `cc`: it was cleaned by the mark of the last batch
        that read it (an earlier batch's mark finds `cseq` at or above its own, a later
        batch read it dirty). The counters and the dirty documents are read, then the
        counters' seqs again: a fold in between, which would count a document in both reads,
        makes the reader read again.
Rule 5. A document is deleted only while the counters count it as nothing: prune marks it
        `leaving` (Rule 2), folds it (again, while a racing folder's batch leaves it dirty),
        then deletes it on the condition (`removable`) that it is still `leaving`, clean, and
        marked as counted as nothing (`cc` null). By Rule 4 a clean document is counted as
        its `cc`; a dirty one may be counted as something by a batch not yet marked on it
        (its `cc` still what an earlier fold marked, or none), and is not deleted (prune
        folds again while a racing folder leaves its batch dirty, a few times: the clean
        term is what keeps the one still dirty after them). "Clean" also means "folded":
        the one write that sets `leaving` (prune's mark) sets `cdirty` with it, and the one
        that clears `cdirty` (a fold's mark) sets `cseq` with it, so a clean leaving
        document always carries a `cseq`, and a term asking for one would add nothing (a
        document never folded is dirty). A commit in between removes the mark (and dirties
        it), and the execution stays.
Rule 6. A counter's seqs never repeat, not even across a counters collection dropped and
        rebuilt (by hand, or by `migrate up` after `migrate down`): an unbuilt counter starts
        at the base of a new epoch (`core.count_build.epoch_base`: epochs are numbered by a document of harel's
        counters collection, which the drop leaves), above every seq a counter of an earlier
        epoch can reach, and its build raises the `cseq` of every document it counts to that
        base before summing it. So the rebuilt counter's marks land (Rule 3: a mark needs
        `cseq` below its seq), a late mark of a fold of the dropped counter, refused by the
        raised `cseq`, cannot change what the rebuilt counter counted, and a fold of the
        dropped counter cannot apply a batch to the new one (its seq is of another epoch).
        A document the build finds dirty is summed as its `cc`, as Rule 4 counts it.

A partition's counter starts unbuilt and is built in batches, off the request path (by the
worker owning it, one batch a sweep, and by `harel-beanie migrate up`), once the layout is
recorded at this version (during `migrate up` executions are still being given their
partition, and one given it behind the cursor would never be counted): a batch takes the
next documents of the partitions being built in `_id` order above the counter's cursor
(`upto`), `core.count_build.build_pipeline` gives those not yet counted their `cc` (a
server-side update of those ids alone), and the sums of the batch's `cc` (`build_sums`) are
added to the counter
with the cursor moved, on the condition that the cursor is still where the batch began.
So a counter not yet built holds the sums of the `cc` of its documents up to its cursor,
and the last batch (fewer documents than asked) marks it built. This stays true under
commits, purges and prune because only a fold changes a `cc` once set, and no fold runs on
an unbuilt partition; a document created during the build is dirty, carries no `cc`, and
is counted by the first fold (Rule 4). A builder killed between its steps leaves the cursor
where it was: the next one sets no `cc` twice and sums the same ones. Until every partition
is built, a reader answers from the built ones and says which are not (`Counts.unbuilt`):
a request never builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional
from urllib.parse import unquote

from harel_beanie.core.stuck import QUIET, quiet_of

#: the fields each execution document carries for the counts (Rule 1, 2, 3, 5)
DIRTY = "cdirty"
COUNTED = "cc"
COUNTED_SEQ = "cseq"
LEAVING = "leaving"
#: what the counts call a document with no status: one harel's own store wrote, not migrated
UNKNOWN = "UNKNOWN"
#: dirty documents one fold reads
FOLD_BATCH = 500
#: a counter's smallest id its partition has held (`Counts.low`); an empty partition's is
#: `NO_ID`, above any id an execution is given, so the first `$min` replaces it
LOW, NO_ID = "low", "\U0010ffff"
#: the dirty documents' fields a fold and a reader need
DIRTY_PROJECTION = {
    "_id": 1,
    "part": 1,
    "definition_id": 1,
    "status": 1,
    "version": 1,
    "born": 1,
    "tomb": 1,
    LEAVING: 1,
    COUNTED: 1,
    COUNTED_SEQ: 1,
    # what `quiet` is computed from (core.stuck), and what pins it (`unchanged`)
    "updated_at": 1,
    "pending": 1,
    "next_fire": 1,
}


def _escape(text: str) -> str:
    """A map key safe in a field path: no '.', no leading '$', no NUL, never empty."""
    return text.replace("%", "%25").replace(".", "%2E").replace("$", "%24").replace("\x00", "%00")


def definition_key(definition: str) -> str:
    return "d" + _escape(definition)


def status_key(status: str) -> str:
    return "s" + _escape(status)


def unkey(key: str) -> str:
    """A definition or status back from its key ('%' is always escaped, so this is exact)."""
    return unquote(key[1:])


def state_of(doc: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """What a stored document should be counted as now (Rule 1)."""
    if doc.get(LEAVING):
        return None
    if "tomb" in doc:
        return {"t": 1}
    if doc.get("definition_id") is None:
        return None
    status = doc.get("status")
    return {"d": str(doc["definition_id"]), "s": status if isinstance(status, str) else UNKNOWN}


def add_delta(inc: dict[str, int], cc: Optional[Mapping[str, Any]], sign: int) -> None:
    """Add `sign` times what `cc` counts to `inc`, an `$inc` of a counter document."""
    if not cc:
        return
    if cc.get("t"):
        inc["t"] = inc.get("t", 0) + sign
        return
    path = f"n.{definition_key(str(cc.get('d')))}.{status_key(str(cc.get('s')))}"
    inc[path] = inc.get(path, 0) + sign  # a `v` an older `cc` carries is not counted (Rule 1)


def effective_cc(doc: Mapping[str, Any], counter: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """What the counter document counts `doc` as (Rule 4)."""
    seq = int(counter.get("seq") or 0)
    if int(doc.get(COUNTED_SEQ) or 0) < seq:
        for entry in counter.get("last") or ():
            if entry.get("_id") == doc.get("_id"):
                cc = entry.get("cc")
                return dict(cc) if cc else None
    cc = doc.get(COUNTED)
    return dict(cc) if cc else None


def entry_of(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A batch entry: the id, what it is now counted as, and what pins the state read and
    its lineage (Rule 3): a tombstone's time and the last creation it buried, an execution's
    version, incarnation (`born`) and leaving mark."""
    entry: dict[str, Any] = {"_id": doc["_id"], "cc": state_of(doc)}
    if "tomb" in doc:
        tomb = doc.get("tomb") or {}
        entry["at"] = tomb.get("at")
        buried = tomb.get("buried") or []
        if buried:
            entry["k"] = buried[-1]
    else:
        entry.update(v=doc.get("version"), b=doc.get("born"), l=bool(doc.get(LEAVING)))
        # what the mark sets `quiet` to, and what it was computed from: an ack or a timer's
        # removal changes these without a new version (core.stuck)
        entry.update(q=quiet_of(doc), p=bool(doc.get("pending")), f=doc.get("next_fire"))
    return entry


def lineage(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The filters matching the document holding the entry's id only while it is of the
    lineage the fold read (Rule 3), one per form it may have taken: that incarnation or
    tombstone, a creation over its tombstone (which keeps the buried creations), a tombstone
    that buried it; never an id created afresh after prune deleted it. A list, tried in
    turn, and not one `$or`: the embedded server reads the whole collection for an `$or`
    even beside an `_id`, and the first filter is the one a mark's usual miss (a commit in
    between) needs."""
    if "at" in entry:
        first = {"tomb.at": entry["at"]}
        token = entry.get("k")
    else:
        first = {"born": entry.get("b")}  # None: a document harel's own store wrote, no lineage
        token = entry.get("b")
    if token is None:
        return [first]
    return [first, {"buried": token}, {"tomb.buried": token}]


def removable() -> dict[str, Any]:
    """What prune's delete adds to its guard (Rule 5): still leaving, clean (so folded), and
    marked as counted as nothing."""
    return {LEAVING: True, DIRTY: {"$exists": False}, COUNTED: None}


def unchanged(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The filter matching the document only while it is as the fold read it (Rule 3)."""
    if "at" in entry:
        return {"tomb.at": entry["at"]}
    out = {
        "version": entry.get("v"),
        "born": entry.get("b"),
        "tomb": {"$exists": False},
        LEAVING: True if entry.get("l") else {"$exists": False},
    }
    if "p" in entry:  # an entry of a batch folded before `quiet` pins neither
        out["pending"] = True if entry["p"] else {"$exists": False}
        out["next_fire"] = entry["f"] if entry.get("f") is not None else {"$exists": False}
    return out


def marked(entry: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """What the mark of an unchanged document sets and unsets beside its count (Rule 3):
    its `quiet` (core.stuck), and the dirty mark cleared."""
    unset = {DIRTY: ""}
    if entry.get("q") is not None:
        return {QUIET: entry["q"]}, unset
    return {}, {**unset, QUIET: ""}


def plan_fold(docs: list[Mapping[str, Any]], counter: Mapping[str, Any]) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """The counter's `$inc` for a batch of dirty documents, and the batch's entries."""
    inc: dict[str, int] = {}
    entries = []
    for doc in docs:
        entry = entry_of(doc)
        add_delta(inc, effective_cc(doc, counter), -1)
        add_delta(inc, entry["cc"], +1)
        entries.append(entry)
    return {k: n for k, n in inc.items() if n}, entries


@dataclass
class Counts:
    """Executions by definition and status, and tombstones, exact at the moment they were
    read. (The commits figure is not counted here: `queries.samples`.)"""

    per: dict[str, dict[str, int]] = field(default_factory=dict)  # definition -> status -> n
    purged: int = 0
    #: no id stored is below this one (a lower bound: a deletion leaves it where it was);
    #: None where a counter does not know (built before counters kept it)
    low: Optional[str] = None
    #: the partitions whose counter is not built yet, whose executions these counts leave
    #: out (empty: the counts are of every execution)
    unbuilt: list[int] = field(default_factory=list)

    def totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for per in self.per.values():
            for status, n in per.items():
                out[status] = out.get(status, 0) + n
        return out

    def add(self, cc: Optional[Mapping[str, Any]], sign: int) -> None:
        if not cc:
            return
        if cc.get("t"):
            self.purged += sign
            return
        per = self.per.setdefault(str(cc.get("d")), {})
        status = str(cc.get("s"))
        per[status] = per.get(status, 0) + sign

    def add_counter(self, counter: Mapping[str, Any]) -> None:
        self.purged += int(counter.get("t") or 0)  # a counter's `v` (Rule 1) is not read
        for dkey, statuses in (counter.get("n") or {}).items():
            per = self.per.setdefault(unkey(dkey), {})
            for skey, n in (statuses or {}).items():
                per[unkey(skey)] = per.get(unkey(skey), 0) + int(n)

    def tidy(self) -> "Counts":
        """Zero counts dropped (a definition with nothing left goes)."""
        per = {d: {s: n for s, n in ss.items() if n} for d, ss in self.per.items()}
        self.per = {d: ss for d, ss in per.items() if ss}
        return self


def combine(counters: list[Mapping[str, Any]], dirty: list[Mapping[str, Any]], part: str) -> Counts:
    """Exact counts from the counter documents and the dirty documents (Rule 4)."""
    out = Counts()
    by_part = {c["_id"]: c for c in counters}
    for c in counters:
        out.add_counter(c)
    for doc in dirty:
        counter = by_part.get(doc.get(part), {})
        out.add(effective_cc(doc, counter), -1)
        out.add(state_of(doc), +1)
    lows = [x for x in (c.get(LOW) for c in counters) if isinstance(x, str)]
    if counters and len(lows) == len(counters):  # every counter knows its partition's
        low = min([*lows, *(d["_id"] for d in dirty if isinstance(d.get("_id"), str))])
        out.low = None if low == NO_ID else low  # NO_ID: no execution held anywhere yet
    return out.tidy()


def fold_low(docs: list[Mapping[str, Any]], counter: Mapping[str, Any]) -> dict[str, Any]:
    """The `$min` keeping a counter's `low` (the smallest id its partition has held) below a
    batch's ids; nothing for a counter built before counters kept one (a `$min` there would
    set a bound that older documents break)."""
    ids = [d["_id"] for d in docs if isinstance(d.get("_id"), str)]
    if not ids or not isinstance(counter.get(LOW), str):
        return {}
    return {"$min": {LOW: min(ids)}}
