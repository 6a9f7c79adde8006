"""The action of tally.stm: append the applied event's id to the context's `seen` list.

It runs on entering Counted or Echoing, which only a `Bump` or an `Echo` leads to (a
deferred one included, when it is delivered again); `event` is None on an execution's first
entry, which is not an event of the client's.
"""

from __future__ import annotations

from typing import Any


def count(stm: Any, event: Any, **kw: Any) -> None:
    if event is not None and event.kind in ("Bump", "Echo"):
        ctx = stm.execution_ctx
        ctx["seen"] = [*(ctx.get("seen") or []), event.id]
