"""The write oracle of the dashboard's POST actions (send, cancel, redrive), driven through the
FastAPI app in-process with httpx.

The model of a post: refused (an action not turned on, a form this dashboard did not serve, a
confirmation that is not the id, an event's data that is not a JSON object of at most 64 KiB
with no NaN or infinity, an event with no kind, a redrive with no state) it calls nothing;
accepted, it makes exactly one call of the app's harel runner, with the values the form
carried (trimmed where a person types them). Either way the dashboard itself writes nothing
but what a read of the counts writes (the page answering a post the runner refused reads
them, and folds as `write_model.counts_read` says): the whole database after the post is
the model's. (What the runner's call
writes is harel's commit through the store, held by tests/doors/test_write_oracle.py.)
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from typing import Any, Iterator, Optional

import httpx
import pymongo
import pytest
from fastapi import FastAPI
from harel.engine.execution import Execution, Status
from hypothesis import given, settings
from hypothesis import strategies as st

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.dashboard import DashboardActions, dashboard_router, no_auth
from tests.dashboard.test_dashboard_app import FakeRunner
from tests.support import write_model as model
from tests.support.fuzz_strategies import clean_text, json_value
from tests.support.fuzz_strategies import oracle_budget as budget
from tests.support.write_model import expect_equal, snapshot

SEEDED = ["x-1", "a/b", " spaced ", "$gt", "日本", "tab\there"]
MAX_EVENT_BYTES = 64 * 1024


def event_payload(text: str) -> Optional[dict[str, Any]]:
    """The data a send carries, or None where it is refused: a JSON object (empty text: {}),
    at most 64 KiB, no NaN or infinity."""
    if len(text.encode("utf-8", "replace")) > MAX_EVENT_BYTES:
        return None
    if not text.strip():
        return {}
    try:
        value = json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def expected_call(action: str, execution_id: str, kind: str, data: str, target: str) -> Optional[tuple[Any, ...]]:
    """The runner call an accepted post makes, or None where it is refused after the guards."""
    if action == "send":
        payload = event_payload(data)
        if payload is None or not kind.strip():
            return None
        return ("send", execution_id, kind.strip(), payload)
    if action == "cancel":
        return ("cancel", execution_id)
    return ("redrive", execution_id, target.strip()) if target.strip() else None


class Dash:
    """The dashboard, every action on (and a second mount with only cancel), on a seeded
    database, with a runner that records its calls and writes nothing."""

    def __init__(self, url: str, db_name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.runner = FakeRunner()
        self.store = AsyncMongoStore(pymongo.AsyncMongoClient(url), db_name)
        self.db = pymongo.MongoClient(url)[db_name]
        for i, s in enumerate(SEEDED):
            status = (Status.FAILED, Status.RUNNING)[i % 2]
            self.loop.run_until_complete(
                self.store.save(Execution(id=s, definition_id="Order", status=status, active_path="Paying"))
            )
        app = FastAPI()
        every = DashboardActions(self.runner, send=True, cancel=True, redrive=True)
        app.include_router(dashboard_router(self.store, auth=no_auth, actions=every, name="all"), prefix="/all")
        some = DashboardActions(self.runner, cancel=True)
        app.include_router(dashboard_router(self.store, auth=no_auth, actions=some, name="some"), prefix="/some")
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        # every counter built and every execution folded before the first post: the runner
        # here writes nothing, so no read the pages make has anything left to fold
        folder = MongoStore(pymongo.MongoClient(url), db_name)
        folder.fold_counts()
        folder.close()

    def call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return self.loop.run_until_complete(self.http.request(method, path, **kw))

    def csrf(self, mount: str, execution_id: str, action: str) -> Optional[str]:
        """The form token of the action's form on the execution's page (None: not offered)."""
        page = self.call("GET", f"/{mount}/execution", params={"id": execution_id}).text
        m = re.search(
            rf'action="[^"]*/{action}\?id=[^"]*"[^>]*>\s*<input type="hidden" name="csrf" value="([0-9a-f]+)"', page
        )
        return m.group(1) if m else None

    def close(self) -> None:
        self.loop.run_until_complete(self.http.aclose())
        self.loop.run_until_complete(self.store.close())
        self.loop.close()


@pytest.fixture(scope="module")
def dash(mongo_url: str) -> Iterator[Dash]:
    db_name = f"hbt_actions_{uuid.uuid4().hex[:10]}"
    d = Dash(mongo_url, db_name)
    yield d
    d.close()
    pymongo.MongoClient(mongo_url).drop_database(db_name)


texts = st.one_of(clean_text, st.sampled_from(["", "  ", " Go ", "Paying", " Paying.Done "]))
data_texts = st.one_of(
    json_value.map(json.dumps),
    st.sampled_from(["", "  ", "{}", '{"a": NaN}', '{"a": Infinity}', "[1]", "{", '"x"', "[" * 5000 + "]" * 5000]),
    st.just(json.dumps({"big": "x" * MAX_EVENT_BYTES})),
)


FAILED_IDS = SEEDED[::2]  # FAILED: every action is offered on their pages
blank = st.sampled_from(["", "  ", "\t"])
good_data = st.one_of(st.just(""), st.dictionaries(clean_text, json_value, max_size=3).map(json.dumps))
bad_data = st.sampled_from(['{"a": NaN}', '{"a": Infinity}', "[1]", "{", '"x"', "[" * 5000 + "]" * 5000])


def action_property(dash: Dash, data: st.DataObject, case: str) -> None:
    mount, execution_id = "all", data.draw(st.sampled_from(FAILED_IDS))
    action = data.draw(st.sampled_from(["send", "redrive"] if case == "not enabled" else ["send", "cancel", "redrive"]))
    if case == "not enabled":
        mount = "some"
    if case == "refused by its values":
        action = data.draw(st.sampled_from(["send", "redrive"]))
    kind, text, target = data.draw(texts), data.draw(data_texts), data.draw(texts)
    if case == "accepted":
        kind = data.draw(texts.filter(lambda t: bool(t.strip())))
        text, target = data.draw(good_data), data.draw(texts.filter(lambda t: bool(t.strip())))
    elif case == "refused by its values":
        text = data.draw(bad_data)
        kind, target = data.draw(st.one_of(blank, texts)), data.draw(blank)
    offered = dash.csrf(mount, execution_id, action)
    csrf = offered if offered is not None and case != "stale form" else uuid.uuid4().hex * 2
    confirm = execution_id + "?" if case == "confirmation not the id" else execution_id
    form = {"confirm": confirm, "csrf": csrf, "kind": kind, "data": text, "target_path": target}
    before = snapshot(dash.db)
    dash.runner.calls.clear()
    answer = dash.call("POST", f"/{mount}/execution/{action}", params={"id": execution_id}, data=form)
    enabled = mount == "all" or action == "cancel"
    served = offered is not None and csrf == offered  # the page offered the form with this token
    if not enabled or not served:
        want, status = None, 403
    elif confirm != execution_id:
        want, status = None, 303
    else:
        want = expected_call(action, execution_id, kind, text, target)
        status = 303 if want is not None else 400
    assert status == OUTCOME[case], (case, status)
    assert answer.status_code == status, f"{action} on {mount}: {answer.status_code}, the model says {status}"
    assert dash.runner.calls == ([want] if want is not None else []), (dash.runner.calls, want)
    # the answer to a post the runner refused is the execution's page: a read of the counts,
    # which folds as every such read does (write_model.counts_read); else nothing is written
    expected = model.counts_read(before)[0] if status == 400 else before
    expect_equal(f"POST {action}", expected, _without_the_samplers_minute(before, snapshot(dash.db)))


SAMPLES = "harel_hb_samples"


def _without_the_samplers_minute(before: model.Snapshot, after: model.Snapshot) -> model.Snapshot:
    """`after` less a sample the dashboard's sampler took while the post was answered: it runs
    on the same loop, once a minute (dashboard.charts.Sampler), so a post that crosses a
    minute's start sees its write, which is no write of the action's. Only a new document
    keyed by a minute's start is taken out; any other change to the samples stays compared."""
    taken = {k for k in after.get(SAMPLES, {}).keys() - before.get(SAMPLES, {}).keys() if float(k) % 60 == 0}
    if not taken:
        return after
    return {**after, SAMPLES: {k: v for k, v in after[SAMPLES].items() if k not in taken}}


#: each case, and the answer its model gives
OUTCOME = {
    "not enabled": 403,
    "stale form": 403,
    "confirmation not the id": 303,
    "refused by its values": 400,
    "accepted": 303,
}


def run(dash: Dash, examples: settings) -> None:
    for case in OUTCOME:

        @examples
        @given(data=st.data())
        def prop(data: st.DataObject) -> None:
            action_property(dash, data, case)

        prop()


def test_a_dashboard_action_calls_its_model_and_writes_nothing_itself(dash: Dash) -> None:
    run(dash, budget(12))


@pytest.mark.soak
def test_a_dashboard_action_at_length(dash: Dash) -> None:
    run(dash, settings(budget(200), derandomize=False))
