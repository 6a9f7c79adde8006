"""Actions of the machine tests/migrate/test_migrate.py runs; each call is logged by its
idempotency key, so a test can tell whether any step's actions ran twice."""

from __future__ import annotations

from typing import Any

CALLS: list[str] = []


def record(stm: Any, event: Any, **kw: Any) -> None:
    ctx = stm.execution_ctx
    ctx["steps"] = int(ctx.get("steps", 0)) + 1
    CALLS.append(str(stm.idempotency_key))
