"""Purge: the execution replaced by its tombstone, and the entries addressed to it pulled.

A purge is final (see `harel_beanie.core.flows`): the tombstone keeps the id, and the creation
tokens of the incarnations it buried, so a late or re-sent creation can't bring the
execution back and a writer whose creation reply was lost still learns it landed.
"""

from __future__ import annotations

import os
from typing import Any

from harel_beanie.core.arguments import require_int, require_str
from harel_beanie.core.calls import DeleteOne, Find, FindOne, Flow, ReplaceOne
from harel_beanie.core.counting import COUNTED, COUNTED_SEQ, DIRTY
from harel_beanie.core.documents import PENDING
from harel_beanie.core.flows.relays import remove_entries
from harel_beanie.core.flows.state import StoreState
from harel_beanie.core.keys import ANY_SEQ

_BURIED_MAX = 64  # creation tokens a tombstone keeps (incarnations of one reused id)
_FOLD_RACES = 3  # reads of an execution whose counts mark keeps moving under the purge


def purge(st: StoreState, execution_id: str, expected_version: int) -> Flow[bool]:
    """Replace the execution, if still at `expected_version`, by its tombstone (see
    `harel_beanie.core.flows`), then pull the entries other executions addressed to it. A purge of
    an execution that moved on touches nothing."""
    execution_id = require_str("execution_id", execution_id)
    expected_version = require_int("expected_version", expected_version)
    purged = False
    for _ in range(_FOLD_RACES):
        fields = {"version": 1, "born": 1, "buried": 1, "tomb": 1, COUNTED: 1, COUNTED_SEQ: 1}
        doc = yield FindOne("executions", {"_id": execution_id}, fields)
        if doc is None or "tomb" in doc:
            break
        if doc.get("version") != expected_version:
            return False  # it moved on: touch nothing
        born = [doc["born"]] if doc.get("born") else []  # harel's documents carry none
        buried = (list(doc.get("buried") or ()) + born)[-_BURIED_MAX:]
        token = os.urandom(8).hex()
        tomb: dict[str, Any] = {"_id": execution_id, "tomb": {"at": st.clock(), "buried": buried, "by": token}}
        tomb["part"] = st.scope.part_of(execution_id)  # the shard key stays with the id
        # what the counts count it as goes with the id, and the tombstone is counted anew
        # (core.counting, Rules 1, 2): guarded, since a fold may mark it in between
        counted = {COUNTED: doc.get(COUNTED), COUNTED_SEQ: doc.get(COUNTED_SEQ)}
        tomb.update({k: v for k, v in counted.items() if v is not None})
        tomb[DIRTY] = True
        guard = {"_id": execution_id, "version": expected_version, "born": doc.get("born"), **counted}
        purged = bool((yield ReplaceOne("executions", guard, tomb)))
        if purged:
            break
        now = yield FindOne("executions", {"_id": execution_id}, {"tomb": 1, "version": 1})
        if now is not None and "tomb" not in now:
            if now.get("version") == expected_version:
                continue  # a fold marked it between the read and the write: read again
            return False  # it moved on between the read and the write
        # buried meanwhile: by this very purge (the driver's retry of a write whose first
        # attempt landed reports nothing matched), or by another: finish the job either way
        purged = (now or {}).get("tomb", {}).get("by") == token
        break
    # entries other executions addressed to it (the ones it issued went with its document)
    # only documents holding entries can hold one for it: the seq index finds those, and the
    # pull is addressed by _id (an index on target_id would cost every commit with an emit,
    # for the sake of a rare purge)
    pending = yield Find("executions", {"outbox.seq": ANY_SEQ} if st.compat else PENDING, {"outbox.target_id": 1})
    holders = [d["_id"] for d in pending if any(e.get("target_id") == execution_id for e in d.get("outbox") or ())]
    if holders:
        query = {"_id": {"$in": holders}, "outbox.target_id": execution_id}
        yield from remove_entries(st, "outbox", query, {"target_id": execution_id}, many=True)
    if st.compat:
        yield DeleteOne("counters", {"_id": "trace:" + execution_id})  # harel's trace counter
    return purged
