"""The dashboard's JSON routes under schemathesis: generated requests (from the OpenAPI schema
the dashboard publishes, valid and invalid) against the real `harel-beanie dashboard` command
serving a database seeded with every kind of document (tests/support/seeds.py). No request may answer
5xx, and every response must match the schema: its status declared, its body the declared
model (a refused parameter answers 400 with the declared error body)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Iterator

import pymongo
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from harel_beanie import AsyncMongoStore
from tests.support.seeds import seed_everything

TOKEN = "schema-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def dashboard(mongo_url: str) -> Iterator[str]:
    db_name = f"hbt_schema_{uuid.uuid4().hex[:10]}"

    async def seed() -> None:
        store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db_name)
        await seed_everything(store, mongo_url, db_name, largest=False)
        await store.close()

    asyncio.run(seed())
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harel_beanie",
            "dashboard",
            "--url",
            mongo_url,
            "--db",
            db_name,
            "--port",
            str(port),
            "--token",
            TOKEN,
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=os.environ.copy(),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(150):  # bounded: 30 s
            try:
                # the schema, like every path of the command's app, is behind the token
                urllib.request.urlopen(urllib.request.Request(f"{base}/openapi.json", headers=AUTH), timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(proc.stderr.read().decode() if proc.stderr else "dashboard exited")
                time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        pymongo.MongoClient(mongo_url).drop_database(db_name)


def _operations(base: str) -> list[Any]:
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json", headers=AUTH)
    return [result.ok() for result in schema.get_all_operations()]


def test_no_generated_request_breaks_the_json_routes(dashboard: str) -> None:
    """Each operation of the schema in turn (schemathesis' strategies driven by hypothesis
    here: its pytest plugin does not run on this pytest), the checks all on."""
    operations = _operations(dashboard)
    assert {op.path for op in operations} >= {"/api/executions", "/api/execution", "/api/failed", "/api/backlog"}
    calls: dict[tuple[str, str], int] = {}
    for op in operations:
        modes = [GenerationMode.POSITIVE]
        if len(op.query) or len(op.path_parameters):  # a route with no parameter has no invalid request
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:  # valid requests, then invalid ones

            @settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def call(case: Any) -> None:
                case.call_and_validate(base_url=dashboard, headers=AUTH)
                calls[(op.path, mode.value)] = calls.get((op.path, mode.value), 0) + 1

            try:
                call()
            except Unsatisfiable:
                # a parameter a query string cannot make invalid (a free string): no negative case
                assert mode is GenerationMode.NEGATIVE, (op.path, mode)
                print(f"{op.path}: no invalid request can be made")
    # every operation was called with valid requests, and the listing with invalid ones too
    assert all(calls.get((op.path, "positive")) for op in operations), calls
    assert calls.get(("/api/executions", "negative")), calls
