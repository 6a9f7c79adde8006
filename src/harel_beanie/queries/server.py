"""What the server behind a collection does with a read: whether naming an index (`hint`)
makes it do less, and whether a `limit` bounds the documents it reads.

Why this module exists: the same read costs differently on different servers, and the
difference decides how a read is sent. On mongod a hint fixes the plan a planner might
otherwise weigh against a collection scan, and a sorted, limited index scan stops after the
page. On the embedded server (SecantusDB) a hinted find or count walks and decodes the whole
named index, and every match is read before the limit keeps its N; unhinted, an equality on
the leading field of a compound index and a range on the next read only that range. So the
reads ask here, once per client, which kind of server they talk to.

SecantusDB reports itself as a MongoDB version; it is told apart by the `secantusVersion`
field of its `buildInfo` reply. A server that does not answer `buildInfo` (a test double) is
taken as mongod.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Mapping

from pymongo.errors import PyMongoError


@dataclass(frozen=True)
class Server:
    """How a server executes a read."""

    name: str
    hints_help: bool  # naming the index makes the server read less (never more)
    limit_bounds_work: bool  # a sorted, limited index scan stops after `limit` documents


MONGOD = Server("mongod", hints_help=True, limit_bounds_work=True)
SECANTUS = Server("SecantusDB", hints_help=False, limit_bounds_work=False)


def server_from(build_info: Mapping[str, Any]) -> Server:
    """The server a `buildInfo` reply describes."""
    return SECANTUS if "secantusVersion" in build_info else MONGOD


_KNOWN: "weakref.WeakKeyDictionary[Any, Server]" = weakref.WeakKeyDictionary()


async def server_of(collection: Any) -> Server:
    """The server an async PyMongo collection is on, asked once per client."""
    client = collection.database.client
    try:
        return _KNOWN[client]
    except (KeyError, TypeError):
        pass
    try:
        info = await client.admin.command("buildInfo")
    except (PyMongoError, NotImplementedError, AttributeError):
        info = {}
    found = server_from(info if isinstance(info, Mapping) else {})
    try:
        _KNOWN[client] = found
    except TypeError:  # a client that takes no weak reference is asked every time
        pass
    return found
