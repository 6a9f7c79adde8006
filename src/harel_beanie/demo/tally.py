"""The count a demo run hands its report: its executions per model with their events and
round trips, how its roots ended, the earlier runs it found, the collections it filled.

Why this module exists: the shop's run (`harel_beanie.demo.run`) and a run of a user's own
models (`harel_beanie.demo.explore`) count the same way and differ only in how a root's
ending is judged (`Ending`); the counting is written once here, apart from the driving.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Callable, Sequence

from harel_beanie.demo.leftovers import RUN_ID_LENGTH, RUN_ID_PREFIX
from harel_beanie.demo.report import Result

#: a root's ending, judged from its execution document: (scenario, expected, ended in, ok)
Ending = Callable[[str, dict[str, Any]], tuple[str, str, str, bool]]


def final_state(doc: dict[str, Any]) -> str:
    """The leaf state an execution is in (or its status, or `missing`), without its parents."""
    return str(doc.get("active_path") or doc.get("status") or "missing").rsplit(".", 1)[-1]


async def earlier_runs(executions: Any) -> list[str]:
    """The run ids of the demo runs whose executions are in `executions`, oldest first."""
    rows = await (
        await executions.aggregate(
            [
                {"$match": {"_id": {"$regex": f"^{RUN_ID_PREFIX}"}, "parent_id": None}},
                {"$group": {"_id": {"$substrCP": ["$_id", 0, RUN_ID_LENGTH]}, "at": {"$min": "$created_at"}}},
                {"$sort": {"at": 1}},
            ]
        )
    ).to_list(None)
    return [r["_id"] for r in rows]


async def tally(
    demo: Any, roots: Sequence[str], ending: Ending, elapsed: float, earlier: int, found: list[str]
) -> Result:
    """What run `demo` (a `Demo`: its executions, workers and counters) did; each of `roots`
    judged by `ending`."""
    executions = demo.executions
    docs = await executions.find(
        {"_id": {"$regex": f"^{demo.run_id}-"}},
        {"definition_id": 1, "status": 1, "outcome": 1, "active_path": 1, "parent_id": 1},
    ).to_list(None)
    model_of = {d["_id"]: d["definition_id"] for d in docs}
    events: Counter[str] = Counter()
    for w in demo.workers:
        events.update(w.events)
    per_model: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"executions": 0, "statuses": Counter(), "outcomes": Counter(), "events": 0, "rt": 0}
    )
    for d in docs:
        row = per_model[d["definition_id"]]
        row["executions"] += 1
        status = d.get("status") or "?"
        row["statuses"][status] += 1
        if status == "DONE":
            row["outcomes"][d.get("outcome") or "none"] += 1
    for eid, n in events.items():
        per_model[model_of.get(eid, "?")]["events"] += n
    rt_events = 0
    for label, n in demo.store_counter.by_label.items():
        if label in model_of:
            per_model[model_of[label]]["rt"] += n
            rt_events += n
    by_id = {d["_id"]: d for d in docs}
    endings: Counter[tuple[str, str, str, bool]] = Counter(ending(eid, by_id.get(eid, {})) for eid in roots)
    collections = {}
    for name in sorted(await executions.database.list_collection_names()):
        if name.startswith(demo.target.prefix + "_"):
            collections[name] = await executions.database[name].estimated_document_count()
    return Result(
        run_id=demo.run_id,
        elapsed=elapsed,
        earlier=earlier,
        earlier_runs=found,
        per_model=dict(per_model),
        endings=[(n, e, got, k, ok) for (n, e, got, ok), k in sorted(endings.items())],
        events=sum(events.values()),
        store_rt=demo.store_counter.by_label,
        store_rt_events=rt_events,
        transport_rt=demo.transport_counter.total,
        collections=collections,
    )
