"""A store's settings and the collections they select, shared by the sync and async store.

Durability defaults: writes are acknowledged by a majority of the replica set
(`w="majority"`; on a standalone server that is the server itself) and wait for the journal
(`j=True`), so an acknowledged commit survives a crash of the server and, on a replica set,
a failover. Reads use the server's default read concern: every read that decides anything
(the CAS, the dedupe window) is settled by the conditional write, not by what was read.
See the README's "Durability" section for what each other choice gives.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from harel.engine.schema import DEFAULT_PREFIX, Names
from harel.engine.store.base import DEFAULT_TRACE_MAX
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from harel_beanie.commit import DEFAULT_DEDUPE_WINDOW
from harel_beanie.documents import bind, index_models
from harel_beanie.flows import StoreState

DEFAULT_WRITE_CONCERN = WriteConcern(w="majority", j=True)


@dataclass(frozen=True)
class StoreSettings:
    db_name: str = "harel"
    prefix: str = "harel"
    create_schema: bool = True
    trace_max: int = 200
    dedupe_window: int = 1000
    write_concern: Optional[WriteConcern] = None  # None: DEFAULT_WRITE_CONCERN
    read_concern: Optional[ReadConcern] = None  # None: the server's default

    def __post_init__(self) -> None:
        Names(self.prefix)  # refuses a prefix harel would refuse, before anything is created
        if not isinstance(self.db_name, str) or not self.db_name or any(c in self.db_name for c in '/\\. "$\x00'):
            raise ValueError(f"db_name must be a MongoDB database name, got {self.db_name!r}")
        if self.dedupe_window < 1:
            raise ValueError(f"dedupe_window must be at least 1, got {self.dedupe_window}")
        if self.write_concern is not None and not self.write_concern.acknowledged:
            # with w=0 no commit's outcome can be known: the CAS would be blind
            raise ValueError(f"write_concern must be acknowledged (not w=0), got {self.write_concern!r}")
        if self.trace_max < 0:
            raise ValueError(f"trace_max must be >= 0 (0 keeps every step), got {self.trace_max}")

    def new_state(self) -> StoreState:
        exes, _ = bind(self.prefix)
        return StoreState(
            trace_max=self.trace_max,
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
    options: dict[str, Any] = {"write_concern": s.write_concern or DEFAULT_WRITE_CONCERN}
    if s.read_concern is not None:
        options["read_concern"] = s.read_concern
    return {
        "executions": db.get_collection(exes.Settings.name, **options),
        "counters": db.get_collection(counters.Settings.name, **options),
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
    ) -> None:
        self._client = client
        self.settings = StoreSettings(db_name, prefix, create_schema, trace_max, dedupe_window, write_concern, read_concern)
        self._colls = collections_for(client, self.settings)
        self._state = self.settings.new_state()
        self._state.in_memory = is_in_memory(client)

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
