"""The names of the collections this package adds beside harel's, under a deployment's prefix.

Why this module exists: the store's sharding check, the transport, the partition leases and the
migrations all name these collections; the rule that builds each name lives once, here, below
every layer that needs it, and free of I/O.
"""

from __future__ import annotations

from typing import Optional

from harel.engine.schema import DEFAULT_PREFIX, Names


def queue_names(prefix: str = DEFAULT_PREFIX) -> tuple[str, str]:
    """The queue and overflow collections under `prefix` (validated as harel does). They are
    this package's own names, apart from harel's transport's `messages` and `locks`, so both
    transports can share a database while a deployment moves from one to the other."""
    Names(prefix)  # raises ValueError on a prefix harel would refuse
    return f"{prefix}_hb_queues", f"{prefix}_hb_overflow"


def partition_collection(prefix: str = DEFAULT_PREFIX) -> str:
    """The collection of the workers' partition leases under `prefix` (one small document
    per partition: `harel_beanie.transport.ownership`). Unsharded on a cluster."""
    Names(prefix)
    return f"{prefix}_hb_partitions"


#: harel's name of the executions collection under a prefix: `<prefix>_executions`
_EXECUTIONS_SUFFIX = "_executions"


def prefix_of(executions: str) -> Optional[str]:
    """The prefix of an executions collection's name (`<prefix>_executions`), or None for a
    name not of that form: where a read that holds only the collection finds the others of
    its deployment (the counts, the kept starts, the schema marker)."""
    if not executions.endswith(_EXECUTIONS_SUFFIX) or executions == _EXECUTIONS_SUFFIX:
        return None
    return executions[: -len(_EXECUTIONS_SUFFIX)]
