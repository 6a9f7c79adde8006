"""Typed, index-backed queries over the store's documents: the way to build a dashboard.

Each function returns a Beanie query (not yet run) over an executions document class, the
default `ExecutionDocument` or `bind(prefix)[0]`, projected to a small row model and served
by one of the indexes declared in `harel_beanie.core.documents` (the tests check each plan with
explain). Run it with `await q.to_list()`, refine it with `.limit(n)`, or page it.

    failed = await failed_since(time.time() - 3600, definition_id="order").to_list()
    kids = await children_of(parent_id).to_list()

`backlog()` gathers what `harel-beanie status` shows: executions by definition and status,
the purged executions' tombstones, the pending outbox and its oldest entry, pending spawns,
the executions holding the oldest pending entries (`harel_beanie.queries.oldest`), due and
next timers, and the stuck executions: `stuck()`, RUNNING and silent for longer than a
threshold with nothing to wake them, or holding a timer overdue by as long (waiting on a timer
or on pending work is not stuck: `harel_beanie.core.stuck`).
`execution_counts()` reads the executions by definition and status from the counters the
store keeps up to date (exact, in a few commands whatever the collection holds).
`executions_page` and `status_counts` list executions matching an `ExecutionFilter`, a page at
a time: by id, or, for a time search (a bound on `updated_at`), newest first.

These need Beanie initialised on the store's database: the async store does it on set-up,
or pass the classes to your own `init_beanie`.

Every argument, and every field of an `ExecutionFilter`, is checked before a query is built
(`harel_beanie.core.arguments`): a value of the wrong type (a dict, a list, a bool where a
number goes, a NaN, another Document class as `doc`) raises TypeError or ValueError naming
the argument, so a value taken from a request can never reach the filter as a query operator
(`{"$ne": None}` as a parent id would list every child of every execution). A value that
passes is used as a literal. Every query reads every document the store can hold: a purge's
tombstone is never listed as an execution, and a document harel's own store wrote before a
migration reads with its summary taken from its snapshot.
"""

from harel_beanie.queries.backlog import MAX_SHOW, Backlog, backlog
from harel_beanie.queries.counts import definition_ids, execution_counts, unbuilt_partitions
from harel_beanie.queries.oldest import PendingHolder
from harel_beanie.queries.pages import (
    COUNT_CAP,
    MAX_LIMIT,
    ExecutionFilter,
    Page,
    executions,
    executions_page,
    status_counts,
)
from harel_beanie.queries.rows import STATUSES, ExecutionDetail, ExecutionRow, TimerRow
from harel_beanie.queries.single import (
    by_status,
    children_of,
    execution_detail,
    failed_since,
    purged,
    stuck_running,
    waiting_on_timer,
)
from harel_beanie.queries.stuck import stuck
from harel_beanie.queries.timed import SPAN_COUNT_CAP

__all__ = [
    "COUNT_CAP",
    "MAX_LIMIT",
    "MAX_SHOW",
    "SPAN_COUNT_CAP",
    "STATUSES",
    "Backlog",
    "ExecutionDetail",
    "ExecutionFilter",
    "ExecutionRow",
    "Page",
    "PendingHolder",
    "TimerRow",
    "backlog",
    "by_status",
    "children_of",
    "execution_detail",
    "executions",
    "definition_ids",
    "execution_counts",
    "unbuilt_partitions",
    "executions_page",
    "failed_since",
    "purged",
    "status_counts",
    "stuck",
    "stuck_running",
    "waiting_on_timer",
]
