"""What a store instance knows between operations, and its set-up.

`StoreState` is shared by every flow of one store instance: its settings, its seq mint
and lease (taken on first mint), whether the database is a not-yet-migrated harel layout,
which document holds each outbox/spawn seq it has seen (so an ack is addressed by `_id`),
what each execution it loaded waited on and which timers it held (so a commit that keeps the
status pins the right `quiet`, and a commit's timer bound is its remaining timers' earliest:
`core.commit`), and the count of operations that lets one relay read answer two calls (`flows.relays`).
It lives apart from the flows so that each of them can import it without importing
another. `setup` is the first flow a store runs.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from harel.engine.store.base import OutboxEntry

from harel_beanie.core.calls import CreateIndexes, FindOne, Flow, UpdateOne
from harel_beanie.core.documents import SCHEMA_MARKER_ID, SCHEMA_VERSION
from harel_beanie.core.errors import SchemaMismatch
from harel_beanie.core.flows.counting import fresh_counters
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, MAX_PARTITIONS, PartitionScope
from harel_beanie.core.seqs import SeqMint
from harel_beanie.core.sizes import DEFAULT_TRACE_STEP_BYTES

log = logging.getLogger("harel_beanie")

_OWNERS_MAX = 100_000  # seq -> owner hints kept for addressing acks by _id
_WAITS_MAX = 10_000  # execution -> what it waited on when loaded, hints for its next commit


@dataclass
class StoreState:
    trace_max: int
    dedupe_window: int
    create_schema: bool
    where: str  # "db <name>, prefix <p>" for messages
    indexes: list[Any]
    trace_step_bytes: int = DEFAULT_TRACE_STEP_BYTES
    clock: Callable[[], float] = time.time  # wall seconds: lease expiry, tombstone time
    ready: bool = False
    compat: bool = False  # the database is harel's MongoStore layout, not migrated
    in_memory: bool = False  # the client is mongomock's: reads and writes it lacks take another form
    # partitions: how many (from the schema marker), whether commands go through a mongos,
    # which ones this store's sweeps read (shared with the worker's transport)
    scope: PartitionScope = field(default_factory=PartitionScope)
    # the database is still at the layout before partitions (a migration may be under way):
    # documents may lack `part`, so nothing filters on it but the sweeps of partition 0
    unpartitioned: bool = False
    mint: SeqMint = field(default_factory=SeqMint)
    owners: dict[int, str] = field(default_factory=dict)
    waits: dict[str, tuple[int, bool, bool, Optional[dict[str, float]]]] = field(default_factory=dict)  # see `loaded`
    # operations started or finished on this instance, and the outbox entries the last
    # `pending_spawns` read with the count they are valid at (see `flows.relays`)
    ops: int = 0
    prefetched: Optional[tuple[Optional[str], list[OutboxEntry], int]] = None
    _ops_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @contextmanager
    def operation(self) -> Iterator[None]:
        """One operation of the store (the shells' `_run`): counted as it starts and again as
        it finishes, however it ends, so a relay read's kept entries are valid only until
        anything else happens on this instance."""
        with self._ops_lock:
            self.ops += 1
        try:
            yield
        finally:
            with self._ops_lock:
                self.ops += 1
                kept = self.prefetched
                if kept is not None and kept[2] < 0:
                    # kept by the operation that just finished: valid until anything else happens
                    self.prefetched = (kept[0], kept[1], self.ops)

    def keep_outbox(self, within: Optional[str], entries: list[OutboxEntry]) -> None:
        with self._ops_lock:
            self.prefetched = (within, entries, -1)

    def take_outbox(self, within: Optional[str]) -> Optional[list[OutboxEntry]]:
        """The kept entries if this is the next operation after the read that kept them
        (only its own start counted since) for the same `within`; they go either way."""
        with self._ops_lock:
            kept, self.prefetched = self.prefetched, None
            if kept is not None and kept[0] == within and kept[2] == self.ops - 1:
                return kept[1]
            return None

    def remember(self, owners: dict[int, str]) -> None:
        if len(self.owners) + len(owners) > _OWNERS_MAX:
            self.owners.clear()  # only hints: an ack without one finds its entry by index
        self.owners.update(owners)

    def loaded(
        self,
        execution_id: str,
        version: int,
        pending: bool,
        timer: bool,
        timers: Optional[dict[str, float]] = None,
    ) -> None:
        """What execution `execution_id` waited on at `version` (an entry pending, a timer
        bound held) and the timers it held (stored key -> fire time; None: not known), as
        read or as committed by this store: hints for the commit at that version only
        (`core.commit` pins the first in the commit's filter; the timers are what the stored
        document held at the version its filter pins, less those removed since: a bound
        taken from them is never above an armed timer, `core.stuck`'s Rule T1)."""
        with self._ops_lock:
            if len(self.waits) >= _WAITS_MAX:
                self.waits.clear()  # only hints: a commit without one pins "waits on nothing"
            self.waits[execution_id] = (version, pending, timer, timers)

    def waited(self, execution_id: str, version: int) -> Optional[tuple[bool, bool]]:
        """The hint `loaded` left for this execution at this version, if any."""
        if not isinstance(execution_id, str):
            return None  # not an id: the commit's plan refuses it, naming it
        with self._ops_lock:
            hint = self.waits.get(execution_id)
        return None if hint is None or hint[0] != version else (hint[1], hint[2])

    def armed(self, execution_id: str, version: int) -> Optional[dict[str, float]]:
        """The timers `loaded` saw this execution hold at this version, if known."""
        if not isinstance(execution_id, str):
            return None
        with self._ops_lock:
            hint = self.waits.get(execution_id)
        return None if hint is None or hint[0] != version or hint[3] is None else dict(hint[3])


#: The layouts a store of this version still runs on while `migrate up` brings them to
#: `SCHEMA_VERSION`, each with whether its documents may lack `part`: on layout 2 every
#: document it writes carries `part`, and its reads do not need it; layout 3 differs from 4
#: only by an index (`documents.LAYOUT_3_INDEXES`) that this version never names.
LIVE_MIGRATION_FROM: dict[int, bool] = {2: True, 3: False}


def marker_parts(marker: Optional[dict[str, Any]]) -> int:
    """The number of partitions a schema marker records (the default where it has none)."""
    parts = (marker or {}).get("parts", DEFAULT_PARTITIONS)
    if isinstance(parts, bool) or not isinstance(parts, int) or not 1 <= parts <= MAX_PARTITIONS:
        raise SchemaMismatch(int((marker or {}).get("n") or 0), SCHEMA_VERSION, f"{parts!r} partitions recorded")
    return parts


def setup(st: StoreState) -> Flow[None]:
    """Indexes (when create_schema) and the layout check. The seq lease is taken on the
    first mint, so a store that only reads never holds one."""
    marker = yield FindOne("counters", {"_id": SCHEMA_MARKER_ID})
    layout = marker.get("n") if marker is not None else None
    if marker is not None and layout != SCHEMA_VERSION:
        unpartitioned = LIVE_MIGRATION_FROM.get(layout) if isinstance(layout, int) else None
        if unpartitioned is None or (unpartitioned and st.scope.sharded):
            # before any index is created: another layout's indexes are its migration's business
            raise SchemaMismatch(int(layout or 0), SCHEMA_VERSION, st.where)
        st.unpartitioned = unpartitioned
        log.warning(
            "%s is at layout %s: running while `harel-beanie migrate up` brings it to %s",
            st.where,
            layout,
            SCHEMA_VERSION,
        )
    st.scope.parts = marker_parts(marker)
    if st.create_schema:
        yield CreateIndexes("executions", st.indexes)
    if marker is None:
        some = yield FindOne("executions", {}, {"_id": 1})
        if some is not None:
            st.compat = True
            log.warning(
                "%s holds executions in harel's MongoStore layout; they load and advance, "
                "but listing, relays and timer sweeps scan them until `harel-beanie migrate up` runs",
                st.where,
            )
        elif st.create_schema:
            fresh = {"n": SCHEMA_VERSION, "parts": st.scope.parts}
            yield UpdateOne("counters", {"_id": SCHEMA_MARKER_ID}, {"$setOnInsert": fresh}, upsert=True)
            # a racing set-up may have recorded its own count first: the record decides
            marker = yield FindOne("counters", {"_id": SCHEMA_MARKER_ID})
            st.scope.parts = marker_parts(marker)
            # a fresh database: its counters are built now, counting nothing (every execution
            # written from now on is dirty, counted by the folds), so no reader ever finds
            # them partial (core.counting's last paragraph)
            yield from fresh_counters(range(st.scope.parts), built=True)
    st.ready = True
