"""The actions an app turned on (send an event, cancel, terminate, suspend, resume, redrive a
failed execution), posted from the execution page and run through harel's own runner
(`acting.py` says which method of which runner, and where each applies).

Each post must carry the form token the page was served with (so a form from another site,
or from another dashboard, is refused) and the execution id typed again. What does not run is
said on the page answering the post, never carried in a link, and never as a 500: what the
form lacks and harel's own refusals (its errors are ValueErrors) answer 400, an action that
does not apply to the execution as it is (or that the runner cannot do) 409.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional

from fastapi import Depends, Form, Query, Request
from fastapi.responses import RedirectResponse, Response
from pymongo.errors import PyMongoError

from harel_beanie import queries
from harel_beanie.dashboard import acting
from harel_beanie.dashboard.context import Dashboard, dashboard
from harel_beanie.dashboard.links import typed_id
from harel_beanie.dashboard.pages.execution import detail, shown
from harel_beanie.dashboard.security import NotFound

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


def definitions_of(dash: Dashboard) -> dict[str, Any]:
    """The machines an event is checked against: the runner's and the dashboard's."""
    held = getattr(dash.actions.runner, "definitions", None)
    return {**(held if isinstance(held, Mapping) else {}), **dash.definitions}


async def run(dash: Dashboard, action: str, execution_id: str, kind: str, data: str, target_path: str) -> None:
    """The action, through the app's harel runner: ValueError for what the form lacks,
    `Refused` where it does not apply to the execution as it is (`acting.py`)."""
    from harel.spec.states import Event

    runner = dash.actions.runner
    s = await dash.ready()
    found = await queries.execution_detail(execution_id, doc=dash.doc(s))
    if found is None:
        raise NotFound(f"no execution {execution_id!r}")
    args: tuple[Any, ...] = (execution_id,)
    if action == "send":
        payload = event_data(data)
        if not kind.strip():
            raise ValueError("an event needs a kind")
        acting.check_event(kind.strip(), found.definition_id, definitions_of(dash))
        args = (execution_id, Event(kind=kind.strip(), data=payload))
    elif action == "redrive":
        if not target_path.strip():
            raise ValueError("redrive needs the leaf state to resume in")
        args = (execution_id, target_path.strip())
    if acting.method_of(runner, action) is None:
        raise acting.Refused(acting.unavailable(runner, action))
    reason = acting.why_not(runner, action, found.status, kind.strip() if action == "send" else None)
    if reason is not None:
        raise acting.Refused(reason)
    try:
        await acting.perform(runner, action, *args)
    except KeyError as exc:  # harel's word for a missing execution, or a machine it was not given
        key = exc.args[0] if exc.args else None
        if key == found.definition_id:
            raise acting.Refused(
                f"the runner does not know the machine {key!r}: it is not among its definitions"
            ) from None
        raise acting.Refused(f"harel found no {'execution ' if key == execution_id else ''}{key!r}") from None


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
    try:
        await run(dash, action, execution_id, kind, data, target_path)
    except (ValueError, TypeError) as exc:  # what the form lacks, or harel's refusal (its errors are ValueErrors)
        return await answered(request, dash, execution_id, str(exc), 400)
    except acting.Refused as exc:
        return await answered(request, dash, execution_id, str(exc), 409)
    except (NotFound, PyMongoError):
        raise  # 404, and the database's own trouble, answered as every page answers them
    except Exception as exc:  # any other refusal of harel's: said on the page, not a 500
        return await answered(
            request, dash, execution_id, f"harel could not {action} it: {type(exc).__name__}: {exc}", 409
        )
    return RedirectResponse(dash.links(request).to("execution", id=execution_id, done=action), status_code=303)


async def answered(request: Request, dash: Dashboard, execution_id: str, message: str, status: int) -> Response:
    """The execution's page saying why the action did not run (the text never travels in a
    link: ?error= takes only the codes of ACTION_ERRORS)."""
    v = await detail(dash, execution_id)
    page = shown(request, dash, execution_id, v, None, message[:300])
    page.status_code = status
    return page
