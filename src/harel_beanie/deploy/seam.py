"""The private parts of harel's `AsyncWorker` that the scoped relay leans on, checked before a
worker starts.

Why this module exists: harel 0.9 offers no public hook for the relay that follows an event's
commit, so `CountingWorker` (`harel_beanie.deploy.stack`) replaces `AsyncWorker._handle` and
hands harel's own `handle_flow` a store whose `pending_outbox` / `pending_spawns` are scoped
(`harel_beanie.deploy.relay`). A harel release that renamed or reshaped any of that would not
fail loudly by itself: the override would go unused, or the relay would read under other
names, and the race the scoping prevents would be back, silently. So each piece is checked
here, once, and a worker refuses to start naming what changed and the harel versions this
release was tested on (`TESTED_ON`, docs/versions.md). `tests/deploy/test_seam.py` runs the
same check against the installed harel.
"""

from __future__ import annotations

import inspect
import types
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, Iterator

from harel_beanie.core.errors import ConfigError

#: the harel releases the seam was checked on, the worker's race tests run on (docs/versions.md)
TESTED_ON = ("0.9.0",)


class HarelSeamChanged(ConfigError):
    """The installed harel's `AsyncWorker` is not what the scoped relay was built on."""


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """`code` and every function body defined inside it, at any depth."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _names(fn: Callable[..., Any]) -> set[str]:
    """Every attribute name and string constant `fn`'s body (and its inner functions) uses."""
    out: set[str] = set()
    for code in _codes(fn.__code__):
        out.update(code.co_names)
        out.update(c for c in code.co_consts if isinstance(c, str))
    return out


def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def problems() -> list[str]:
    """What in the installed harel differs from the seam, one phrase each (none: it holds)."""
    from harel.engine import flow
    from harel.engine.aio.distributed import AsyncWorker
    from harel.engine.driving import TransportDriverLogic

    found: list[str] = []
    handle = getattr(AsyncWorker, "_handle", None)
    if handle is None or not inspect.iscoroutinefunction(handle) or _params(handle) != ["self", "lease"]:
        found.append("AsyncWorker._handle(self, lease) is not an async method")
    elif "_handle" not in _names(AsyncWorker.run):
        found.append("AsyncWorker.run no longer hands each claimed event to self._handle")
    handle_flow = getattr(AsyncWorker, "handle_flow", None)
    if handle_flow is None or _params(handle_flow)[:3] != ["self", "lease", "combined_load"]:
        found.append("AsyncWorker.handle_flow(lease, combined_load) is gone")
    run_async = getattr(flow, "run_async", None)
    if run_async is None or _params(run_async)[:2] != ["flow", "ports"]:
        found.append("harel.engine.flow.run_async(flow, ports) is gone")
    flush = getattr(TransportDriverLogic, "_flush_flow", None)
    if flush is None or not {"pending_outbox", "pending_spawns"} <= _names(flush):
        found.append("the relay after a commit no longer reads the store's pending_outbox and pending_spawns")
    return found


def installed() -> str:
    try:
        return version("harel")
    except PackageNotFoundError:  # a source checkout on the path
        return "(unknown version)"


@lru_cache(maxsize=1)
def check() -> None:
    """Raise `HarelSeamChanged` if the installed harel lacks any piece of the seam (checked
    once a process)."""
    found = problems()
    if found:
        raise HarelSeamChanged(
            f"harel {installed()} is not the harel this worker was built on: {'; '.join(found)}. "
            f"harel-beanie's scoped relay is tested on harel {', '.join(TESTED_ON)} (docs/versions.md): install that"
        )
