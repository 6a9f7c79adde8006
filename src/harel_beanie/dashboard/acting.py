"""The dashboard's actions on one execution, over whichever of harel's runners the app passes.

Why this module exists: harel's runners do not share one interface, and harel's control plane
does nothing, silently, where a command does not apply. `AsyncDistributedRunner` (and the sync
`DistributedRunner`) queue an event with `send`, for the workers; `AsyncDurableRunner` (and
`DurableRunner`) have no `send`: `process` runs the event at once, in the caller's process. The
sync runners block, and refuse to be called on a running event loop. `resume` of an execution
that is not SUSPENDED, `suspend` of one not RUNNING, `redrive` of one not FAILED, `cancel` of a
finished one: each returns without a word. So this module says, once:

- which method of the runner each action calls (`method_of`), hence which actions a runner can
  do at all: the page shows the others as unavailable (`offer`);
- in which statuses each action does something (`why_not`): the page offers an action only
  there, and a post that arrives when it no longer applies is answered with the reason;
- what an event sent from the page may be (`check_event`): not harel's own `Start` or
  `Cancel` (the Cancel action is the door for that), and, where the execution's machine is
  known, a kind one of its states takes;
- how the call is made (`perform`): awaited, or, for a sync runner, in a worker thread.

What the runner itself raises (an event whose data does not fit its declaration, a redrive
to a state that is not a leaf, an execution gone) is harel's refusal: the page answering the
post shows it (`pages/actions.py`).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Optional

from starlette.concurrency import run_in_threadpool

from harel_beanie.dashboard import statechart

#: every action the dashboard offers (the names `DashboardActions` and `--allow` take)
ACTIONS = ("send", "cancel", "redrive", "terminate", "suspend", "resume")

#: the methods an action may call, by preference: a runner that queues events has `send`,
#: one that runs them at once has `process`
METHODS = {"send": ("send", "process")}

FINISHED = ("DONE", "CANCELLED")
#: the statuses in which harel's control plane changes an execution (elsewhere it is a no-op)
APPLIES = {
    "cancel": ("PENDING", "RUNNING", "SUSPENDED", "FAILED"),
    "terminate": ("PENDING", "RUNNING", "SUSPENDED", "FAILED", "CANCELLING"),
    "suspend": ("RUNNING",),
    "resume": ("SUSPENDED",),
    "redrive": ("FAILED",),
}
#: events the page never sends, and why: the engine's own, each with its own door
NOT_SENT = {
    "Start": "an execution is started when it is created; harel refuses a Start sent to it",
    "Cancel": "a Cancel goes through the Cancel action, which asks harel to run the model's cleanup",
}


class Refused(Exception):
    """The action does not apply to the execution as it is: answered on the page (409)."""


def method_of(runner: Any, action: str) -> Optional[Callable[..., Any]]:
    """The runner's method for `action`, or None when it has none."""
    for name in METHODS.get(action, (action,)):
        try:
            method = getattr(runner, name, None)
        except LookupError:  # a runner built later (the standalone app's) is not there yet
            return None
        if callable(method):
            return method  # type: ignore[no-any-return]
    return None


def queues(runner: Any) -> bool:
    """Whether the runner queues a sent event (for workers) rather than processing it now."""
    return callable(getattr(runner, "send", None))


def why_not(runner: Any, action: str, status: Optional[str], kind: Optional[str] = None) -> Optional[str]:
    """Why `action` does nothing on an execution in `status` (None: it applies). For `send`,
    `kind` is the event's (None: the page asks whether to offer the form at all, which it does
    wherever some event applies: `Reset`, harel's start-over, applies even to a DONE one, and
    to a CANCELLED one where the runner processes it itself)."""
    if action == "send":
        if status == "CANCELLING":
            return "it is being cancelled: harel drops every event until its cleanup has run"
        if status == "CANCELLED" and queues(runner):
            return "it is CANCELLED: a finished execution takes no event (the workers drop them all, Reset included)"
        if kind is None or kind == "Reset":
            return None
        if status in FINISHED:
            return f"it is {status}: a finished execution takes no event but Reset (harel would drop it)"
        if not queues(runner) and status != "RUNNING":
            return (
                f"it is {status}: this runner processes an event at once, and harel ignores an event "
                "while an execution is not RUNNING"
            )
        return None
    allowed = APPLIES[action]
    if status in allowed:
        return None
    return f"it is {status}: {action} applies to {', '.join(allowed)} executions only (harel would do nothing)"


def unavailable(runner: Any, action: str) -> str:
    """What the page says of an action turned on that the runner cannot do."""
    names = " or ".join(f"`{m}`" for m in METHODS.get(action, (action,)))
    return f"unavailable: the runner ({type(runner).__name__}) has no {names}"


def event_kinds(definitions: Mapping[str, Any], definition_id: str) -> Optional[set[str]]:
    """The events some state of the machine takes (its transitions', deferred and declared
    ones), or None when the machine is not known here."""
    defn = statechart.find_definition(dict(definitions), definition_id)
    if defn is None:
        return None
    kinds = set(defn.events)
    for node in defn.index.values():
        kinds |= set(node.defer)
        kinds |= {t.event_filter.kind for t in node.transitions if t.event_filter is not None}
    return kinds


def check_event(kind: str, definition_id: str, definitions: Mapping[str, Any]) -> None:
    """Refused: an event of harel's own the page does not send, or a kind no state of a known
    machine takes (a typo, most often: harel would drop it without a word)."""
    if kind in NOT_SENT:
        raise Refused(f"{kind!r} is not sent from the dashboard: {NOT_SENT[kind]}")
    kinds = event_kinds(definitions, definition_id)
    if kinds is not None and kind not in kinds | {"Reset"}:
        known = ", ".join(sorted(kinds - set(NOT_SENT))) or "none"
        raise Refused(f"no state of {definition_id} takes the event {kind!r} (it takes: {known})")


async def perform(runner: Any, action: str, *args: Any) -> None:
    """The action through the runner: awaited, or in a worker thread for a sync runner
    (harel's sync runners refuse to run on an event loop)."""
    method = method_of(runner, action)
    if method is None:
        raise Refused(unavailable(runner, action))
    if inspect.iscoroutinefunction(method):
        await method(*args)
        return
    result = await run_in_threadpool(method, *args)
    if inspect.isawaitable(result):
        await result


def offer(runner: Any, enabled: list[str], status: Optional[str]) -> tuple[list[str], dict[str, str]]:
    """The actions turned on that the page offers on an execution in `status`, and why each
    other is not."""
    offered: list[str] = []
    others: dict[str, str] = {}
    for action in enabled:
        reason = unavailable(runner, action) if method_of(runner, action) is None else why_not(runner, action, status)
        if reason is None:
            offered.append(action)
        else:
            others[action] = reason
    return offered, others
