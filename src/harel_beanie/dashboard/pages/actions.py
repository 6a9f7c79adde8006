"""The actions an app turned on (send an event, cancel, redrive a failed execution), posted
from the execution page and run through harel's own runner.

Each post must carry the form token the page was served with (so a form from another site,
or from another dashboard, is refused) and the execution id typed again; harel's refusals
are shown on the page answering the post, never carried in a link.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from fastapi import Depends, Form, Query, Request
from fastapi.responses import RedirectResponse, Response

from harel_beanie.dashboard.context import Dashboard, dashboard
from harel_beanie.dashboard.links import typed_id
from harel_beanie.dashboard.pages.execution import detail, shown

#: the most a sent event's JSON data may weigh
MAX_EVENT_BYTES = 64 * 1024


def event_data(text: str) -> dict[str, Any]:
    """A sent event's data: a JSON object of at most `MAX_EVENT_BYTES`, with no NaN or
    infinity (harel stores strict JSON)."""

    def no_constant(name: str) -> Any:
        raise ValueError(f"data: {name} is not JSON")

    if len(text.encode("utf-8", "replace")) > MAX_EVENT_BYTES:
        raise ValueError(f"data: at most {MAX_EVENT_BYTES} bytes of JSON")
    try:
        payload = json.loads(text, parse_constant=no_constant) if text.strip() else {}
    except RecursionError:
        raise ValueError("data: nested too deeply") from None
    if not isinstance(payload, dict):
        raise ValueError("data: must be a JSON object")
    return payload


def refused(
    dash: Dashboard, request: Request, action: str, execution_id: str, confirm: str, csrf: str
) -> Optional[Response]:
    """The answer to a post that may not run: an action not offered, a form this dashboard
    did not serve, or a confirmation that does not match the id (None when it may run)."""
    if action not in dash.actions.enabled():
        return Response(f"the {action[:40]!r} action is not enabled on this dashboard", status_code=403)
    if not dash.forms.valid(csrf, execution_id, action):
        return Response("the form is stale or was not served by this dashboard: reload the page", status_code=403)
    if confirm.strip() not in (execution_id.strip(), typed_id(execution_id).strip()):
        return RedirectResponse(dash.links(request).to("execution", id=execution_id, error="confirm"), status_code=303)
    return None


async def run(dash: Dashboard, action: str, execution_id: str, kind: str, data: str, target_path: str) -> None:
    """The action, through the app's harel runner (ValueError for what it needs and lacks)."""
    from harel.spec.states import Event

    runner = dash.actions.runner
    if action == "send":
        payload = event_data(data)
        if not kind.strip():
            raise ValueError("an event needs a kind")
        await runner.send(execution_id, Event(kind=kind.strip(), data=payload))
    elif action == "cancel":
        await runner.cancel(execution_id)
    else:
        if not target_path.strip():
            raise ValueError("redrive needs the leaf state to resume in")
        await runner.redrive(execution_id, target_path.strip())


async def act(
    request: Request,
    action: str,
    execution_id: str = Query(..., alias="id"),
    confirm: str = Form(""),
    csrf: str = Form(""),
    kind: str = Form(""),
    data: str = Form(""),
    target_path: str = Form(""),
    dash: Dashboard = Depends(dashboard),
) -> Response:
    answer = refused(dash, request, action, execution_id, confirm, csrf)
    if answer is not None:
        return answer
    await dash.ready()
    try:
        await run(dash, action, execution_id, kind, data, target_path)
    except (ValueError, KeyError, TypeError) as exc:
        # harel's refusals (and bad input): the page, answering this post, says why; the
        # text never travels in a link (?error= takes only the codes of ACTION_ERRORS)
        v = await detail(dash, execution_id)
        page = shown(request, dash, execution_id, v, None, str(exc)[:300])
        page.status_code = 400
        return page
    return RedirectResponse(dash.links(request).to("execution", id=execution_id, done=action), status_code=303)
