"""A store's settings and the collections they select, shared by the sync and async store.

Durability defaults: writes are acknowledged by a majority of the replica set
(`w="majority"`; on a standalone server that is the server itself) and wait for the journal
(`j=True`), so an acknowledged commit survives a crash of the server and, on a replica set,
a failover. Ordinary reads use the server's default read concern (or the one given): every
decision a read feeds is settled by a conditional write. The two reads whose answer the
store reports as a fact (a commit whose reply was lost did land; an event was already
processed) are read at majority whenever writes are acknowledged by a majority, so what
the store reports can't be rolled back; the seq leases are always written and read at
majority (see `harel_beanie.core.seqs`). docs/design.md, "Durability", gives each choice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from harel.engine.schema import DEFAULT_PREFIX, Names
from harel.engine.store.base import DEFAULT_TRACE_MAX
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from harel_beanie.core.arguments import BadArgumentType, require_bool, require_int, require_str
from harel_beanie.core.commit import DEFAULT_DEDUPE_WINDOW
from harel_beanie.core.count_documents import counts_collection
from harel_beanie.core.documents import bind, index_models
from harel_beanie.core.flows import StoreState
from harel_beanie.core.partitions import PartitionScope
from harel_beanie.core.sizes import DEFAULT_TRACE_STEP_BYTES, MAX_EVENT_ID_BYTES, MAX_TRACE_RING_BYTES

DEFAULT_WRITE_CONCERN = WriteConcern(w="majority", j=True)
_MAJORITY_READ = ReadConcern("majority")
_MAX_DEDUPE_WINDOW = 2 * 1024 * 1024 // MAX_EVENT_ID_BYTES  # the window's bytes stay bounded


@dataclass(frozen=True)
class StoreSettings:
    db_name: str = "harel"
    prefix: str = "harel"
    create_schema: bool = True
    trace_max: int = 200
    dedupe_window: int = 1000
    write_concern: Optional[WriteConcern] = None  # None: DEFAULT_WRITE_CONCERN
    read_concern: Optional[ReadConcern] = None  # None: the server's default
    trace_step_bytes: int = DEFAULT_TRACE_STEP_BYTES

    def __post_init__(self) -> None:
        require_str("prefix", self.prefix)
        Names(self.prefix)  # refuses a prefix harel would refuse, before anything is created
        require_bool("create_schema", self.create_schema)
        for name in ("trace_max", "dedupe_window", "trace_step_bytes"):
            require_int(name, getattr(self, name))
        if not isinstance(self.db_name, str) or not self.db_name or any(c in self.db_name for c in '/\\. "$\x00'):
            raise ValueError(f"db_name must be a MongoDB database name, got {self.db_name!r}")
        if not 1 <= self.dedupe_window <= _MAX_DEDUPE_WINDOW:
            raise ValueError(f"dedupe_window must be from 1 to {_MAX_DEDUPE_WINDOW:,}, got {self.dedupe_window}")
        if not 1024 <= self.trace_step_bytes or self.trace_max * self.trace_step_bytes > MAX_TRACE_RING_BYTES:
            raise ValueError(
                f"trace_step_bytes must be at least 1024 and trace_max x trace_step_bytes at most "
                f"{MAX_TRACE_RING_BYTES:,} (the trace ring's share of a document), got "
                f"{self.trace_max} x {self.trace_step_bytes}"
            )
        if self.write_concern is not None and not self.write_concern.acknowledged:
            # with w=0 no commit's outcome can be known: the CAS would be blind
            raise ValueError(f"write_concern must be acknowledged (not w=0), got {self.write_concern!r}")
        if self.trace_max < 0:
            raise ValueError(f"trace_max must be >= 0 (0 keeps every step), got {self.trace_max}")

    def new_state(self) -> StoreState:
        exes, _ = bind(self.prefix)
        return StoreState(
            trace_max=self.trace_max,
            trace_step_bytes=self.trace_step_bytes,
            dedupe_window=self.dedupe_window,
            create_schema=self.create_schema,
            where=f"database {self.db_name!r}, prefix {self.prefix!r}",
            indexes=index_models(exes),
        )


def collections_for(client: Any, s: StoreSettings) -> dict[str, Any]:
    """The collections a store's calls address, with its concerns applied. Works the same on
    PyMongo's sync and async clients, Motor and mongomock (all share this API)."""
    exes, counters = bind(s.prefix)
    db = client[s.db_name]
    write_concern = s.write_concern or DEFAULT_WRITE_CONCERN
    options: dict[str, Any] = {"write_concern": write_concern}
    if s.read_concern is not None:
        options["read_concern"] = s.read_concern
    confirm = dict(options)
    if write_concern.document.get("w") == "majority":
        confirm["read_concern"] = _MAJORITY_READ
    majority = {"write_concern": DEFAULT_WRITE_CONCERN, "read_concern": _MAJORITY_READ}
    return {
        "executions": db.get_collection(exes.Settings.name, **options),
        "confirm": db.get_collection(exes.Settings.name, **confirm),
        "counters": db.get_collection(counters.Settings.name, **options),
        "leases": db.get_collection(counters.Settings.name, **majority),
        "counts": db.get_collection(counts_collection(s.prefix), **options),
    }


class StoreShell:
    """What the sync and the async store share before any I/O: the settings, the
    collections they select and the state the flows keep between operations."""

    def __init__(
        self,
        client: Any,
        db_name: str = "harel",
        *,
        prefix: str = DEFAULT_PREFIX,
        create_schema: bool = True,
        trace_max: int = DEFAULT_TRACE_MAX,
        dedupe_window: int = DEFAULT_DEDUPE_WINDOW,
        write_concern: Optional[WriteConcern] = None,
        read_concern: Optional[ReadConcern] = None,
        trace_step_bytes: int = DEFAULT_TRACE_STEP_BYTES,
        sharded: Optional[bool] = None,
        partitions: Optional[PartitionScope] = None,
    ) -> None:
        """`sharded`: whether commands go through a mongos, so that each names its partition
        (None: asked of the server at set-up). `partitions`: the scope to share with a
        transport and a partition owner (`harel_beanie.transport.ownership`); a new one,
        covering every partition, by default."""
        self._client = client
        self.settings = StoreSettings(
            db_name, prefix, create_schema, trace_max, dedupe_window, write_concern, read_concern, trace_step_bytes
        )
        self._colls = collections_for(client, self.settings)
        self._state = self.settings.new_state()
        self._state.in_memory = is_in_memory(client)
        if sharded is not None and not isinstance(sharded, bool):
            raise BadArgumentType("sharded", "True, False or None", sharded)
        if partitions is not None:
            if not isinstance(partitions, PartitionScope):
                raise BadArgumentType("partitions", "a PartitionScope", partitions)
            self._state.scope = partitions
        if sharded is not None:
            self._state.scope.sharded = sharded
        self._detect_mongos = sharded is None and not self._state.in_memory

    @property
    def compat(self) -> bool:
        """Whether the database still holds harel's MongoStore layout (not migrated): then
        pending work has no flag and is found by its arrays."""
        return self._state.compat

    @property
    def partitions(self) -> PartitionScope:
        """The partitions this store works on: how many the database has (known once set
        up), whether its commands name them, which ones its sweeps read."""
        return self._state.scope

    @property
    def trace_max(self) -> int:
        """The trace ring keeps the last `trace_max` steps (0: every step). Settable, as on
        harel's stores; the next commit or `append_trace` uses the new value."""
        return self._state.trace_max

    @trace_max.setter
    def trace_max(self, value: int) -> None:
        self.settings = replace(self.settings, trace_max=value)  # validates it
        self._state.trace_max = value

    # harel's Mongo stores keep these, and tests written for them reach into them
    @property
    def _db(self) -> Any:
        return self._client[self.settings.db_name]

    @property
    def _exes(self) -> Any:
        return self._colls["executions"]

    @property
    def _counters(self) -> Any:
        return self._colls["counters"]


def is_in_memory(client: Any) -> bool:
    """Whether `client` is mongomock's or mongomock-motor's in-memory fake."""
    # mongomock-motor's client class presents itself as Motor's: look along its bases
    return any(k.__module__.split(".")[0] in ("mongomock", "mongomock_motor") for k in type(client).__mro__)
