"""The private seam of harel's `AsyncWorker` that `Worker` (and `harel-beanie worker`) leans
on: present in the installed harel, and a harel without it refused at start, naming what
changed and the harel versions this release was tested on (docs/versions.md).

What the scoped relay needs: `AsyncWorker._handle(self, lease)`, async, called by `run` for
each claimed event; `handle_flow(lease, combined_load)` and `run_async(flow, ports)`, through
which the override runs harel's own handling; and a relay that reads the store's
`pending_outbox` / `pending_spawns`, the two reads `ScopedStore` narrows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from harel.engine.aio.distributed import AsyncWorker
from harel.engine.driving import TransportDriverLogic
from harel.engine.hosting import WorkerLogic

from harel_beanie import Worker
from harel_beanie.commands import cli
from harel_beanie.deploy import HarelSeamChanged, default_models_dir, load_models, seam
from harel_beanie.deploy.stack import CountingWorker


@pytest.fixture(autouse=True)
def fresh_check() -> Iterator[None]:
    """The check runs once a process: each test here sees it run on what it patched."""
    seam.check.cache_clear()
    yield
    seam.check.cache_clear()


def test_the_installed_harel_has_the_seam() -> None:
    assert seam.problems() == []
    assert seam.installed() in seam.TESTED_ON, (seam.installed(), seam.TESTED_ON)
    assert CountingWorker._handle is not AsyncWorker._handle  # the override is ours, over harel's
    versions = (Path(__file__).resolve().parents[2] / "docs" / "versions.md").read_text()
    assert all(v in versions for v in seam.TESTED_ON)  # the page names what the seam was tested on


async def _run_loop_without_handle(self: Any, stop: Any, idle_sleep: float = 0.005) -> None:
    """A `run` that handles events some other way (it never names the private method)."""


def _flush_without_pending_reads(self: Any, primary_priority: Any = None) -> Any:
    yield None


@pytest.mark.parametrize(
    "where,name,replacement,said",
    [
        (AsyncWorker, "_handle", None, "AsyncWorker._handle(self, lease) is not an async method"),
        (AsyncWorker, "run", _run_loop_without_handle, "AsyncWorker.run no longer hands each claimed event"),
        (WorkerLogic, "handle_flow", None, "handle_flow(lease, combined_load) is gone"),
        (TransportDriverLogic, "_flush_flow", _flush_without_pending_reads, "no longer reads the store's pending"),
    ],
)
def test_a_harel_without_the_seam_is_refused_before_anything_is_opened(
    monkeypatch: pytest.MonkeyPatch, where: type, name: str, replacement: Any, said: str
) -> None:
    """Each piece taken away in turn: building a `Worker` (or the command's `CountingWorker`)
    raises `HarelSeamChanged` naming it and the tested versions, before any connection (the
    URL here has no server behind it)."""
    if replacement is None:
        monkeypatch.delattr(where, name)
    else:
        monkeypatch.setattr(where, name, replacement)
    definitions = load_models(default_models_dir())
    with pytest.raises(HarelSeamChanged) as refused:
        Worker("mongodb://127.0.0.1:1", definitions)
    message = str(refused.value)
    assert said in message and "tested on harel 0.9.0" in message and "docs/versions.md" in message, message
    with pytest.raises(HarelSeamChanged):
        CountingWorker(object(), object(), definitions, executions=object())


def test_the_worker_command_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """`harel-beanie worker` on such a harel: one line naming what changed, exit 2."""
    monkeypatch.delattr(AsyncWorker, "_handle")
    code = cli.main(["worker", "--url", "mongodb://127.0.0.1:1", "--definitions", str(default_models_dir())])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, (code, err)
    assert "AsyncWorker._handle" in err and "tested on harel 0.9.0" in err, err
