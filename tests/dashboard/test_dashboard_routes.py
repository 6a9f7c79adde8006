"""The dashboard is a route table over per-page modules: every route the router serves is a
row of `harel_beanie.dashboard.routes.ROUTES` (served by the handler the row names, under the
name it gives), and no module of the dashboard declares a route any other way. The dashboard
sits above the commands' layer only by accident of history: it imports none of them, and reads
no private attribute of a store (it used to take a helper from the `status` command).
None of these needs a database."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry

import harel_beanie.dashboard
from harel_beanie.dashboard import DashboardActions, dashboard_router, no_auth
from harel_beanie.telemetry.metrics import StoreMetrics

DASHBOARD = Path(harel_beanie.dashboard.__file__).parent
#: the calls and decorators that declare a route on a FastAPI or Starlette router or app
DECLARING = {"get", "post", "put", "patch", "delete", "head", "options", "api_route", "route", "websocket"}
ADDING = {"add_api_route", "add_route", "add_websocket_route", "add_api_websocket_route", "include_router", "mount"}
#: the layers above the dashboard's (the command line and what runs it)
COMMANDS = ("harel_beanie.ops", "harel_beanie.commands")
#: the app `harel-beanie dashboard` serves: an app of its own around the router (its schema
#: behind the token), not a route of the dashboard
OWN_APP = "serve.py"


def _modules() -> list[Path]:
    found = sorted(DASHBOARD.rglob("*.py"))
    assert len(found) > 10, "no dashboard module found: is the package where this test looks?"
    return found


def _trees() -> Iterator[tuple[str, ast.Module]]:
    for path in _modules():
        yield str(path.relative_to(DASHBOARD)), ast.parse(path.read_text(), str(path))


def _served(metrics: bool) -> set[tuple[str, str, str, Any]]:
    """What the router gives an app: (method, path, name, handler) of each of its routes."""
    kw: dict[str, Any] = {"metrics": StoreMetrics(CollectorRegistry())} if metrics else {}
    acts = DashboardActions(runner=object(), send=True, cancel=True, redrive=True)
    router = dashboard_router(object(), auth=no_auth, actions=acts, name="d", **kw)
    assert all(isinstance(r, APIRoute) for r in router.routes), "a route of another kind is not compared here"
    out = {(m, r.path, r.name, r.endpoint) for r in router.routes if isinstance(r, APIRoute) for m in r.methods}
    assert out, "the router has no route: is it built as the test expects?"
    return out


@pytest.mark.parametrize("metrics", [True, False], ids=["with-metrics", "without-metrics"])
def test_every_route_served_is_a_row_of_the_table(metrics: bool) -> None:
    """The routes the app serves are exactly the table's rows (the metrics row only with a
    `StoreMetrics`), each by the row's handler under the row's name."""
    from harel_beanie.dashboard.routes import METRICS, ROUTES

    table = {(row.method, row.path, f"d.{row.name}", row.handler) for row in ROUTES if metrics or row.kind != METRICS}
    assert _served(metrics) == table


def test_only_the_router_declares_routes() -> None:
    """No module of the dashboard declares a route by decorator (`@router.get(...)`) or by
    call: the one `add_api_route` is the router's, over the table's rows."""
    found = []
    for name, tree in _trees():
        if name == OWN_APP:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for d in node.decorator_list:
                    target = d.func if isinstance(d, ast.Call) else d
                    if isinstance(target, ast.Attribute) and target.attr in DECLARING:
                        found.append(f"{name}:{d.lineno} @{target.attr}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in ADDING and name != "router.py":
                    found.append(f"{name}:{node.lineno} .{node.func.attr}()")
                first = node.args[0] if node.args else None
                path_like = isinstance(first, ast.Constant) and str(first.value).startswith("/")
                if node.func.attr in DECLARING and path_like:
                    found.append(f"{name}:{node.lineno} .{node.func.attr}({first.value!r})")  # type: ignore[union-attr]
    assert not found, f"routes declared outside the table (put them in routes.py): {found}"


def _imported(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Call):  # import_module("..."), __import__("...")
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
                yield node.lineno, str(node.args[0].value)


def test_no_dashboard_module_imports_a_command() -> None:
    found = [
        f"{name}:{line} {module}"
        for name, tree in _trees()
        for line, module in _imported(tree)
        if any(module == c or module.startswith(c + ".") for c in COMMANDS)
    ]
    assert not found, f"the dashboard imports the commands' layer: move what it needs down ({found})"


def test_no_dashboard_module_reads_a_private_attribute_of_another_object() -> None:
    """A name starting with `_` is read only on `self` or `cls` (the module's own classes):
    never on a store, a collection, a request or any other object, by attribute or by
    `getattr`."""
    found = []
    for name, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value.id if isinstance(node.value, ast.Name) else None
                if owner not in ("self", "cls"):
                    found.append(f"{name}:{node.lineno} .{node.attr}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
            ):
                if len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                    attr = str(node.args[1].value)
                    if attr.startswith("_") and not attr.startswith("__"):
                        found.append(f"{name}:{node.lineno} {node.func.id}(..., {attr!r})")
    assert not found, f"private attributes read from outside their class: {found}"


async def test_each_of_two_dashboards_in_one_app_answers_as_itself() -> None:
    """The handlers are shared by every dashboard an app mounts; each request is given the
    dashboard whose router serves it (its name, so its links), not the last one built."""
    app = FastAPI()
    for name in ("first", "second"):
        app.include_router(dashboard_router(object(), auth=no_auth, name=name), prefix=f"/{name}")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        for name in ("first", "second"):
            r = await http.get(f"/{name}/executions/x")
            assert (r.status_code, r.headers["location"]) == (307, f"/{name}/execution?id=x")
