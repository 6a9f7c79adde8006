"""Every store operation, written once as a flow of database calls.

A flow is a generator: it yields a call from `harel_beanie.core.calls`, the store makes it and
sends the result back in (or throws the driver's error in), and the flow's return value is
the operation's result. The logic of an operation (what it asks, in what order, what the
answers mean, what is retried) lives only here; `MongoStore` and `AsyncMongoStore` only make
the calls, one with PyMongo's sync client and one awaiting the async client. harel's engine
drives its own steps the same way (`yield from store(...)`).

One module per job, each importing only `state` and the modules before it:
- `state`: `StoreState`, what a store instance knows between operations, and `setup`;
- `leases`: the seq mint's node leases (`mint_seqs`, `release_lease`);
- `reads`: loads, the dedupe check, listing, traces, ids by prefix;
- `committing`: `commit` (and its recovery of lost replies) and `append_trace`;
- `relays`: what harel's relay and timer sweep ask (pending entries, acks, due timers);
- `purging`: `purge`, which leaves a tombstone;
- `counting`: the counts kept up to date (`fold_counts`, `read_counts`).

Two rules the flows keep beyond a single write:

- Purge is final. A purged execution leaves a tombstone (`{_id, tomb: {at, buried}}`) that
  holds its id, so a creation insert that lands late, or is re-sent, fails on the id
  instead of bringing the execution and its pending work back. `buried` lists the creation
  tokens (`born`) of every incarnation purged under that id: a writer whose creation reply
  was lost finds its token there and knows it landed; any other creation of the id (harel's
  normal create of a reused id) replaces the tombstone. Every read treats a tombstone as
  no execution.
- What the store reports as landed or as already seen is read back at the level writes are
  acknowledged at (`confirm` reads: majority when the write concern is majority), so on a
  replica set it can't be rolled back after the store said so.
"""

from harel_beanie.core.flows.committing import UNKNOWN_OUTCOME_RETRIES, append_trace, commit
from harel_beanie.core.flows.counting import fold_counts, read_counts
from harel_beanie.core.flows.leases import mint_seqs, release_lease
from harel_beanie.core.flows.purging import purge
from harel_beanie.core.flows.reads import (
    ids_with_prefix,
    is_processed,
    list_executions,
    load,
    load_for_event,
    read_trace,
)
from harel_beanie.core.flows.relays import (
    ack_outbox,
    ack_spawn,
    delete_timer,
    due_timers,
    next_timer,
    pending_outbox,
    pending_spawns,
)
from harel_beanie.core.flows.state import StoreState, setup

__all__ = [
    "UNKNOWN_OUTCOME_RETRIES",
    "StoreState",
    "ack_outbox",
    "ack_spawn",
    "append_trace",
    "commit",
    "delete_timer",
    "fold_counts",
    "read_counts",
    "due_timers",
    "next_timer",
    "ids_with_prefix",
    "is_processed",
    "list_executions",
    "load",
    "load_for_event",
    "mint_seqs",
    "pending_outbox",
    "pending_spawns",
    "purge",
    "read_trace",
    "release_lease",
    "setup",
]
