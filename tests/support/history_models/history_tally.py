"""The action of the Tally model (tally.stm): the one effect the history checker counts."""

from typing import Any


def count(stm: Any, event: Any, **kw: Any) -> None:
    """Append the applied event's id to `seen`. A new list each time, never appended in place:
    the store compares and commits the context as a value, and a shared list would let an
    uncommitted attempt leak into the next one."""
    if event is not None and event.kind in ("Bump", "Echo"):
        ctx = stm.execution_ctx
        ctx["seen"] = list(ctx.get("seen") or []) + [event.id]
