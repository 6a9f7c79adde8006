"""The replay a history's final states are compared with: harel's in-memory run of one root.

Why this module exists: rule 4 of the history checker (`harel_beanie.history.checker`) asks
what state an execution should have ended in, given the events it accepted. The answer
comes from harel itself, free of any store or network under test: its `AsyncDictStore` and
`AsyncInMemoryTransport`, driven by `AsyncWorkerDriver` on a `ManualClock`. The execution is
created with the context it was created with, then each event is sent in the order it was
applied, and after the creation and after each event the clock runs on (`Timers(within=...)`)
until every timer of the window has fired and every child has finished. A model whose
events commute once its timers have run (as the history tests' model is built to) then ends
where the recorded run ended, whatever the interleaving was there.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from harel.definition.model import Definition
from harel.engine.aio_store.dict import AsyncDictStore
from harel.engine.aio_transport.inmemory import AsyncInMemoryTransport

from harel_beanie.harness.drivers import AsyncWorkerDriver, Create, ManualClock, Send, Step, Timers
from harel_beanie.harness.snapshots import asnapshot
from harel_beanie.history.checker import ReplayCase

#: how long the clock runs after the creation and after each event (seconds)
SETTLE = 3600.0


async def areplay(case: ReplayCase, definitions: dict[str, Definition], *, settle: float = SETTLE) -> dict[str, Any]:
    """Run `case.exe` again on harel's in-memory store: created as `case.definition` with
    `case.context`, then sent `case.events` one by one, the clock run `settle` seconds after
    the creation and after each. Returns its `status`, `active_path`, `context` and
    `children` (id -> status), in the JSON form a history holds them."""
    clock = ManualClock()
    store = AsyncDictStore()
    driver = AsyncWorkerDriver(store, AsyncInMemoryTransport(clock), definitions, clock, trace=False)
    steps: list[Step] = [Create(case.definition, case.exe, dict(case.context)), Timers(within=settle)]
    for eid, kind, data in case.events:
        steps += [Send(case.exe, kind, eid, dict(data)), Timers(within=settle)]
    await driver.run(steps)
    executions = (await asnapshot(store))["executions"]
    root = executions[case.exe]
    return {
        "status": root["status"],
        "active_path": root["active_path"],
        "context": root["context"],
        "children": {cid: e["status"] for cid, e in executions.items() if e.get("parent_id") == case.exe},
    }


def replay(case: ReplayCase, definitions: dict[str, Definition], *, settle: float = SETTLE) -> dict[str, Any]:
    """`areplay`, blocking: the checker is plain code and calls its replay plainly. Called
    from a coroutine (a test that records and then checks in one loop), the replay runs on a
    loop of its own in a helper thread while the caller's loop waits: it is the end of the
    run, and nothing else of that loop needs to move meanwhile."""

    def run() -> dict[str, Any]:
        return asyncio.run(areplay(case, definitions, settle=settle))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="replay") as pool:
        return pool.submit(run).result()
