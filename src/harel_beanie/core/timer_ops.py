"""A commit's timer ops, in stored form, and the timers it leaves: what its timer bound is
taken from (`core.stuck`, Rule T1).

Why this module exists: the bound must be as if a cancelled timer had never been armed, and
that needs the timers a commit leaves, not only the ones it arms; both are computed here,
with no I/O, for the commit's plan (`core.commit`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

from harel.engine.store.base import TimerOp

from harel_beanie.core.arguments import require_str
from harel_beanie.core.keys import encode_path


def final_timer_ops(timers: Sequence[TimerOp]) -> dict[str, Optional[float]]:
    """Path -> fire_at (None = cancel), the last op per path winning: one update can't both
    `$set` and `$unset` the same field."""
    out: dict[str, Optional[float]] = {}
    for op in timers:
        require_str("timers[].path", op.path)
        if op.action == "schedule":
            at = float(op.fire_at)
            if not math.isfinite(at):  # a NaN bound would match no sweep and hide every timer
                raise ValueError(f"timer {op.path!r} must fire at a finite time, got {op.fire_at!r}")
            out[op.path] = at
        elif op.action == "cancel":
            out[op.path] = None
        else:
            raise ValueError(f"unknown timer action {op.action!r} for path {op.path!r}")
    return out


def remaining_timers(
    armed: Optional[Mapping[str, float]], timer_ops: Mapping[str, Optional[float]]
) -> Optional[dict[str, float]]:
    """The timers a commit leaves by Rule T1 (`armed`, the loaded ones, less its cancels,
    with its schedules), by stored key; None when the loaded ones are not known."""
    if armed is None:
        return None
    left = dict(armed)
    for path, at in timer_ops.items():
        if at is None:
            left.pop(encode_path(path), None)
        else:
            left[encode_path(path)] = at
    return left


def bound_update(
    timer_ops: Mapping[str, Optional[float]],
    left: Optional[dict[str, float]],
    set_ops: dict[str, Any],
    unset_ops: dict[str, str],
    update: dict[str, Any],
) -> None:
    """The timer bound's part of a commit's update (Rule T1): the earliest of the timers it
    leaves, or none, as if a cancelled timer had never been armed (`quiet` is then the
    fold's: a cancel is marked); where those are not known, `$min` on schedule."""
    if timer_ops and left is not None:
        if left:
            set_ops["next_fire"] = min(left.values())
        else:
            unset_ops["next_fire"] = ""
        return
    schedules = [at for at in timer_ops.values() if at is not None]
    if schedules:
        update["$min"] = {"next_fire": min(schedules)}
