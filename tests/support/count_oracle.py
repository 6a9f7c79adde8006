"""The counts' invariants, checked against the stored documents after every step a schedule
explorer makes (tests/support/explore.py).

Why this module exists: the counters (`harel_beanie.core.counting`) are state kept beside
the executions; what they must say is decided here independently of the rules that keep them,
from the documents alone, and compared after every step:

- exact: the counters plus the dirty documents (Rule 4, `combine`) equal an independent count
  of the documents, at every step; and each clean document is counted, and marked (`cc`), as
  what it is (Rule 4 corrects only the dirty ones, and from `cc` once the last batch is
  another: a clean one marked wrong is counted wrong from its next change), and carries the
  `quiet` its state calls for (`core.stuck`: what the backlog lists as stuck);
- nothing deleted while counted: a document that disappears in a step was counted as nothing
  by the counters just before it (what Rule 4 says they hold for it);
- at quiescence, after a settling fold run alone: no document is left dirty, and the counters
  alone equal the independent count (what a killed flow left is repaired by the next fold);
- a reader's answer (`read_counts`) equals the independent count at some moment between its
  first call and its last.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from harel.engine.schema import DEFAULT_PREFIX

from harel_beanie.core.calls import Flow
from harel_beanie.core.count_documents import counts_collection
from harel_beanie.core.counting import Counts, combine, effective_cc, state_of
from harel_beanie.core.stuck import QUIET, quiet_of

EXES = f"{DEFAULT_PREFIX}_executions"
Tally = tuple[dict[str, dict[str, int]], int]


def independent(docs: list[dict[str, Any]]) -> Tally:
    """What the counts must be: executions by definition and status (not those prune has
    begun removing), and tombstones (`core.counting`, Rule 1: an execution is counted as its
    definition and status, not its version)."""
    per: dict[str, dict[str, int]] = {}
    purged = 0
    for d in docs:
        if d.get("leaving"):
            continue
        if "tomb" in d:
            purged += 1
            continue
        if d.get("definition_id") is None:
            continue
        status = d.get("status") if isinstance(d.get("status"), str) else "UNKNOWN"
        s = per.setdefault(str(d["definition_id"]), {})
        s[status] = s.get(status, 0) + 1
    return per, purged


def tally(counts: Counts) -> Tally:
    return counts.per, counts.purged


class CountsOracle:
    """The invariants above on database `db` (a sync PyMongo database)."""

    def __init__(self, db: Any, extra: Optional[list[str]] = None) -> None:
        self.db = db
        self.extra = extra or []  # other collections whose state the fingerprint includes
        self.removed: list[tuple[Any, Any]] = []  # (id, incarnation) of each document deleted
        self.exes = db[EXES]
        self.counts = db[counts_collection(DEFAULT_PREFIX)]
        self.history: list[Tally] = []
        self.last: Any = None  # the state the last check saw, as `fingerprint` gives it
        self._before: Optional[tuple[dict[Any, dict[str, Any]], dict[Any, dict[str, Any]]]] = None

    def snapshot(self) -> tuple[dict[Any, dict[str, Any]], dict[Any, dict[str, Any]]]:
        docs = {d["_id"]: d for d in self.exes.find({})}
        counters = {c["_id"]: c for c in self.counts.find({})}
        return docs, counters

    def start(self) -> None:
        """Called once the start state is in place, before a schedule's first step."""
        self._before = self.snapshot()
        self.history = [independent(list(self._before[0].values()))]
        self.removed = []

    def check(self, _steps: Any = None) -> None:
        docs, counters = self.snapshot()
        # a partition whose counter is not built yet is left out of the counts (readers say
        # so: `Counts.unbuilt`); its counter holds the sums of the `cc` up to its cursor
        built = {p: c for p, c in counters.items() if c.get("built")}
        for p, c in counters.items():
            if p not in built:
                assert_build_sums(c, [d for d in docs.values() if d.get("part") == p])
        truth = independent([d for d in docs.values() if d.get("part") in built])
        self.history.append(truth)
        # records by what they are of (their keys and times are minted anew in every run)
        fields = {"_id": 0, "execution_id": 1, "document.born": 1}
        others = {n: sorted(repr(d) for d in self.db[n].find({}, fields)) for n in self.extra}
        self.last = (_frozen(docs), _frozen(counters), frozenset(map(repr, self.history)), repr(sorted(others.items())))
        dirty = [d for d in docs.values() if d.get("cdirty") and d.get("part") in built]
        got = tally(combine(list(built.values()), dirty, "part"))
        assert got == truth, f"the counts by Rule 4 are {got}, the documents say {truth}"
        for doc in docs.values():
            # Rule 4 corrects only the dirty ones (and a build marks each of its own)
            if not doc.get("cdirty") and doc.get("part") in built:
                held, now = effective_cc(doc, counters.get(doc["part"], {})), state_of(doc)
                assert held == now, f"clean {doc['_id']!r} is counted as {held}, it is {now}"
                # and its own mark says so: the next change corrects from `cc` once its batch
                # is no longer the last
                assert doc.get("cc") == now, f"clean {doc['_id']!r} is marked {doc.get('cc')}, it is {now}"
                # and the fold's other mark, what `/backlog` lists as stuck (core.stuck)
                quiet = quiet_of(doc)
                assert doc.get(QUIET) == quiet, f"clean {doc['_id']!r} has quiet {doc.get(QUIET)}, it should be {quiet}"
        if self._before is not None:
            old_docs, old_counters = self._before
            for gone in old_docs.keys() - docs.keys():
                doc = old_docs[gone]
                self.removed.append((gone, doc.get("born")))
                held = effective_cc(doc, old_counters.get(doc.get("part"), {}))
                assert not held, f"{gone!r} was deleted while the counters counted it as {held}"
        self._before = (docs, counters)

    def fingerprint(self) -> Any:
        """The state the last check saw: the documents, the counters, and the counts they
        have had (what a reader's answer is checked against)."""
        return self.last

    def quiescent(self) -> None:
        """After a settling fold: nothing dirty, and the counters alone are exact."""
        docs, counters = self.snapshot()
        dirty = sorted(str(d["_id"]) for d in docs.values() if d.get("cdirty"))
        assert not dirty, f"still dirty after a settling fold: {dirty}"
        truth = independent(list(docs.values()))
        got = tally(combine(list(counters.values()), [], "part"))
        assert got == truth, f"the counters say {got}, the documents {truth}"

    def reader(self, flow: Callable[[], Flow[Optional[tuple[Counts, int]]]]) -> Flow[None]:
        """A reader actor: runs `flow` (a `read_counts`) and checks that its answer is the
        independent count at some moment between its first call and its last."""
        inner = flow()
        reply: Any = None
        mark: Optional[int] = None
        try:
            while True:
                c = inner.send(reply)
                reply = yield c
                if mark is None:
                    mark = len(self.history) - 1  # the state its first call saw
        except StopIteration as done:
            answer = done.value
        if answer is None:
            return  # the counters could not answer (a caller counts the collection)
        got = tally(answer[0])
        seen = self.history[mark or 0 :]
        assert got in seen, f"read_counts answered {got}, the counts were {seen} while it read"


def assert_build_sums(counter: dict[str, Any], docs: list[dict[str, Any]]) -> None:
    """An unbuilt counter holds the sums of the `cc` of its partition's documents up to its
    cursor (core.counting's last paragraph: no fold changes a `cc` before the build is over)."""
    upto = counter.get("upto")
    want = Counts()
    for d in docs:
        if upto is not None and d["_id"] <= upto and isinstance(d.get("cc"), dict):
            want.add(d["cc"], +1)
    held = Counts()
    held.add_counter(counter)
    assert tally(held.tidy()) == tally(want.tidy()), (
        f"unbuilt counter {counter['_id']} holds {held}, its cursor {upto!r} says {want}"
    )


def _frozen(docs: dict[Any, dict[str, Any]]) -> str:
    return repr(sorted((repr(k), repr(sorted(v.items(), key=lambda kv: kv[0]))) for k, v in docs.items()))
