"""The reads: one execution (alone or with its dedupe verdict), listing, traces, ids.

Each is a single round trip except a dedupe hit, which is confirmed by a `confirm` read
before harel is told to drop the event (see `harel_beanie.core.flows`). None of them writes,
so they need nothing from the other flows but `StoreState`.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from harel.engine.execution import Execution, ExecutionPage, Status

from harel_beanie.core import records
from harel_beanie.core.arguments import require_str
from harel_beanie.core.calls import Find, FindOne, Flow
from harel_beanie.core.documents import LoadView, TraceView, projection
from harel_beanie.core.flows.state import StoreState
from harel_beanie.core.keys import prefix_range
from harel_beanie.core.listing import listing_page, listing_query
from harel_beanie.core.sizes import dedupe_keys

#: what a load reads beside the snapshot: what the execution waits on (an entry pending, a
#: timer bound held, the timers armed), small fields kept as the next commit's hints
#: (`StoreState.loaded`): the timers make the commit's timer bound exact (`core.commit`)
_LOAD = {**projection(LoadView), "pending": 1, "next_fire": 1, "timers": 1}


def _loaded(st: StoreState, doc: Optional[dict[str, Any]]) -> Optional[Execution]:
    exe = records.execution(doc)
    if exe is not None and doc is not None:
        st.loaded(exe.id, exe.version, bool(doc.get("pending")), "next_fire" in doc, records.timers_held(doc))
    return exe


def load(st: StoreState, execution_id: str) -> Flow[Optional[Execution]]:
    doc = yield FindOne("executions", {"_id": require_str("execution_id", execution_id)}, _LOAD)
    return _loaded(st, doc)


def load_for_event(st: StoreState, execution_id: str, event_id: str) -> Flow[tuple[Optional[Execution], bool]]:
    """The execution and whether it already processed `event_id`, in one round trip: the
    `$elemMatch` projection returns at most the one matching id, never the whole window.
    "Already processed" makes harel drop the event, so it is confirmed by a `confirm` read
    (majority on a replica set) before it is believed: a mark that a failover could still
    roll back must not lose the event. That second read happens only for a duplicate."""
    keys = dedupe_keys(require_str("event_id", event_id))
    if st.in_memory:
        # mongomock has no `$elemMatch` projection of a scalar array; in memory, the whole
        # window costs no transfer (and there is no replica set to confirm against)
        proj = {**_LOAD, "processed": 1}
        doc = yield FindOne("executions", {"_id": require_str("execution_id", execution_id)}, proj)
        exe = _loaded(st, doc)
        return exe, exe is not None and any(k in (doc or {}).get("processed", ()) for k in keys)
    proj = {**_LOAD, "processed": {"$elemMatch": {"$in": keys}}}
    doc = yield FindOne("executions", {"_id": require_str("execution_id", execution_id)}, proj)
    exe = _loaded(st, doc)
    if exe is None or not (doc or {}).get("processed"):
        return exe, False
    return exe, (yield from is_processed(st, execution_id, event_id))


def is_processed(st: StoreState, execution_id: str, event_id: str) -> Flow[bool]:
    # a point read by _id projecting the one matching id, as load_for_event does: cheaper
    # on some servers than a filter on the array; a `confirm` read, as it decides a drop
    keys = dedupe_keys(require_str("event_id", event_id))
    if st.in_memory:  # no `$elemMatch` projection in mongomock: the filter on the array
        query = {"_id": require_str("execution_id", execution_id), "processed": {"$in": keys}}
        return (yield FindOne("executions", query, {"_id": 1})) is not None
    proj = {"_id": 1, "processed": {"$elemMatch": {"$in": keys}}}
    doc = yield FindOne("confirm", {"_id": require_str("execution_id", execution_id)}, proj)
    return bool(doc and doc.get("processed"))


def list_executions(
    st: StoreState,
    status: Optional[Iterable[Status]],
    definition_id: Optional[str],
    roots_only: bool,
    limit: int,
    cursor: Optional[str],
) -> Flow[ExecutionPage]:
    q = listing_query(status, definition_id, roots_only, limit, cursor, compat=st.compat)
    docs = yield Find("executions", q.filter, q.projection, sort=[("_id", 1)], limit=q.limit)
    return listing_page(q, docs)


def read_trace(st: StoreState, execution_id: str) -> Flow[list[dict[str, Any]]]:
    doc = yield FindOne("executions", {"_id": require_str("execution_id", execution_id)}, projection(TraceView))
    return records.trace_steps(doc)


def ids_with_prefix(st: StoreState, prefix: str) -> Flow[list[str]]:
    docs = yield Find("executions", prefix_range(prefix), {"_id": 1, "tomb": 1})
    return [d["_id"] for d in docs if "tomb" not in d]
