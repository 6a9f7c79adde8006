"""`Worker` in an app's own process, beside the app's store: the app's typed queries keep the
app's client while the worker runs and after it stops, and a stop set before the worker got
going ends it cleanly.
"""

from __future__ import annotations

import asyncio

from harel.engine.execution import Execution, Status

from harel_beanie import AsyncMongoStore, ExecutionDocument, Worker
from harel_beanie.deploy import default_models_dir, load_models


async def test_the_apps_typed_queries_outlive_the_worker(mongo_url: str, db_name: str) -> None:
    """The app opened its store (which binds the document classes to the app's client), then
    ran a worker and stopped it, as a FastAPI lifespan does. The worker closes its own
    clients; had it bound the classes to one of them, the app's next typed query would fail
    on a closed client."""
    store = await AsyncMongoStore.from_url(mongo_url, db_name)
    try:
        await store.commit(Execution(id="o-1", definition_id="Order", status=Status.FAILED), [])
        stop = asyncio.Event()
        worker = Worker(mongo_url, load_models(default_models_dir()), db_name=db_name, concurrency=4)
        running = asyncio.create_task(worker.run(stop))
        await asyncio.sleep(0)  # let it start
        stop.set()
        await running
        failed = await ExecutionDocument.find(ExecutionDocument.status == "FAILED").to_list()
        assert [d.id for d in failed] == ["o-1"]
    finally:
        await store.close()
