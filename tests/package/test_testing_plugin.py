"""`harel_beanie.testing` as an app uses it: a small app module and its own test file, run
by pytest in a child process with the plugin opted in, in memory and on the server."""

from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ["pytester"]

APP = '''
"""A user's app: orders that get paid, on harel's runners over whichever store it is given."""
from harel import DurableRunner, Event, definition_from_dsl
from harel.engine.aio.durable import AsyncDurableRunner

ORDER = definition_from_dsl("""
machine Order {
  initial Placed
  state Placed {}
  state Paid {}
  final Shipped success
  from Placed to Paid on Pay
  from Paid to Shipped on Ship
}
""", "Order")


def pay(store, order_id):
    runner = DurableRunner(store, {ORDER.id: ORDER})
    exe = runner.create(ORDER.id, execution_id=order_id)
    runner.process(exe.id, Event(kind="Pay", id="pay-" + order_id))
    runner.process(exe.id, Event(kind="Pay", id="pay-" + order_id))  # redelivered: deduped
    return runner.process(exe.id, Event(kind="Ship"))


async def apay(store, order_id):
    runner = AsyncDurableRunner(store, {ORDER.id: ORDER})
    exe = await runner.create(ORDER.id, execution_id=order_id)
    await runner.process(exe.id, Event(kind="Pay", id="pay-" + order_id))
    return await runner.process(exe.id, Event(kind="Ship"))
'''

APP_TESTS = """
import os

from harel_beanie import ExecutionDocument, queries

import shop

SERVER = os.environ.get("HAREL_BEANIE_TEST_STORE") == "server"


def test_an_order_is_paid_and_shipped(harel_store):
    exe = shop.pay(harel_store, "A-1")
    assert exe.status.value == "DONE" and exe.active_path == "Shipped"
    assert harel_store.is_processed("A-1", "pay-A-1")
    assert [s.id for s in harel_store.list_executions().items] == ["A-1"]


def test_each_test_has_a_store_of_its_own(harel_store):
    assert harel_store.load("A-1") is None


async def test_the_async_store(harel_async_store):
    exe = await shop.apay(harel_async_store, "B-1")
    assert exe.status.value == "DONE"
    assert await harel_async_store.is_processed("B-1", "pay-B-1")
    if SERVER:  # Beanie is initialised on the store's database: typed queries see the data
        doc = await ExecutionDocument.get("B-1")
        assert doc is not None and doc.status == "DONE"
        done = await queries.failed_since(0).to_list()
        assert done == []
"""

CONFTEST = """
pytest_plugins = ["harel_beanie.testing"]
"""


@pytest.fixture
def app(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(shop=textwrap.dedent(APP), test_shop=textwrap.dedent(APP_TESTS))
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nasyncio_mode = auto\n")
    return pytester


def test_an_apps_tests_in_memory(app: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HAREL_BEANIE_TEST_STORE", raising=False)
    result = app.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_an_apps_tests_on_the_server(app: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, mongo_url: str) -> None:
    # the suite's server stands for the app's MONGODB_URL (the plugin would start its own)
    monkeypatch.setenv("MONGODB_URL", mongo_url)
    monkeypatch.setenv("HAREL_BEANIE_TEST_STORE", "server")
    result = app.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_the_option_chooses_the_store(app: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, mongo_url: str) -> None:
    monkeypatch.setenv("MONGODB_URL", mongo_url)
    monkeypatch.delenv("HAREL_BEANIE_TEST_STORE", raising=False)
    result = app.runpytest_subprocess("-p", "no:cacheprovider", "--harel-store=server", "-k", "own")
    result.assert_outcomes(passed=1, deselected=2)


@pytest.mark.parametrize("missing", ["pytest", "pytest_asyncio", "mongomock"])
def test_the_plugin_without_its_extra_names_the_extra(missing: str, tmp_path) -> None:
    """`import harel_beanie.testing` (or its memory store) where the `testing` extra is not
    installed: an ImportError naming the extra to install, not a bare `No module named pytest`."""
    import subprocess
    import sys

    # a module of that name that cannot be imported, first on the path: the extra missing
    (tmp_path / f"{missing}.py").write_text("raise ImportError('not installed', name=__name__)\n")
    code = "import harel_beanie.testing as t; t.memory_store()"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, capture_output=True, text=True
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:") and "pip install 'harel-beanie[testing]'" in last, done.stderr
