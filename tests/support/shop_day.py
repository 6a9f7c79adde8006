"""A worker's day on the shop's models, as the wire recorders want it: harel's worker logic
(`CountingWorker`) claiming and handling one event at a time until the queues are idle, then
a relay sweep, the counts' fold, a timer armed, fired and deleted, a trace step and a look
at the next timer.

Why this module exists: the targeting audit (tests/sharding/test_audit.py) and the index-use
table (tests/store/test_index_use.py) both record every command such a day sends, one to
classify it against the shard plan, the other against the indexes; one script keeps what
they record the same.
"""

from __future__ import annotations

from typing import Any

from harel.engine.aio.distributed import AsyncDistributedRunner
from harel.engine.store.base import TimerOp

from harel_beanie.deploy.loader import load_models
from harel_beanie.deploy.relay import sweep
from harel_beanie.deploy.stack import CountingWorker
from tests.commands.test_cli import MODELS
from tests.sharding.audit import OP


async def shop_day(store: Any, transport: Any, executions: Any) -> tuple[int, int]:
    """Run the day on `store` and `transport` (labelled, so each command names its
    operation); `executions` is the executions collection the worker counts in. Returns the
    events the worker handled and the executions the fold counted."""
    definitions = load_models(MODELS)
    sender = AsyncDistributedRunner(store, transport, dict(definitions))
    for i in range(3):
        await sender.create("Payment", {"order_id": f"p{i}", "amount": 5.0}, execution_id=f"pay-{i}")
    await sender.create("PickLine", {"sku": "OOS-1"}, execution_id="pick-short")
    await sender.create("Order", {"order_id": "o1", "amount": 9.5, "lines": ["SKU-1", "SKU-2"]}, execution_id="o-1")
    worker = CountingWorker(
        store, transport, dict(definitions), worker_id="w", visibility=30.0, concurrency=1, executions=executions
    )
    idle = 0
    while idle < 3:  # the worker's loop, one event at a time (its `run` with a stop)
        lease = await worker._claim()  # noqa: SLF001 - harel's worker's own step, as `run` takes it
        if lease is None:
            idle += 1
            await worker.fire_due_timers()
            continue
        idle = 0
        await worker._handle(lease)  # noqa: SLF001
    token = OP.set("sweep")
    try:
        await sweep(store, transport, executions, dict(definitions))
    finally:
        OP.reset(token)
    folded = await store.fold_counts()  # the worker's counts fold, after each sweep (deploy/serving.py)
    # a timer fired and deleted, a trace step appended: the sweep's and the trace's writes
    exe = await store.load("pick-short")
    assert exe is not None
    await store.commit(exe, [], timers=(TimerOp("schedule", "W.ait", 1.0),))
    for execution_id, path, fire_at in await store.due_timers(2.0):
        await store.delete_timer(execution_id, path, fire_at)
    await store.append_trace("pick-short", {"kind": "note"})
    await store.next_timer(0.0)
    return worker.handled, folded
