"""The statechart's size on the execution page, in a real headless Chromium.

A 4-state chart used to be drawn about 2,000 px tall: Mermaid gives its drawing `width="100%"`
and keeps its natural size in an inline `max-width` style, which the page's policy refuses
(dashboard.js leaves every inline style out), so a narrow drawing was stretched to the page's
width and grew as tall in proportion, pushing the execution's details off screen. The drawing
is now given its natural size, scaled down to fit a bounded height.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import pymongo
import pytest
from harel.engine.execution import Execution, Status

from harel_beanie import MongoStore
from tests.dashboard.test_dashboard_runners import ACTIONS_PY, TICKET
from tests.support.browser import Dashboard, browser_missing, browser_session

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))

TOKEN = "size-" + "t" * 20
#: the most the page lets a drawing take (dashboard.js, MAX_CHART_HEIGHT)
MAX_HEIGHT = 560


@pytest.fixture(scope="module")
def dash(mongo_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    models = tmp_path_factory.mktemp("size_models")
    (models / "ticket.stm").write_text(TICKET)
    (models / "dash_ticket_actions.py").write_text(ACTIONS_PY)
    db = "hbt_size_" + str(int(time.time() * 1000))[-9:]
    store = MongoStore(pymongo.MongoClient(mongo_url), db)
    store.save(Execution(id="t-1", definition_id="Ticket", status=Status.RUNNING, active_path="Open"))
    store.close()
    d = Dashboard(mongo_url, db, TOKEN, "--definitions", str(models)).wait()
    try:
        yield d
    finally:
        d.stop()
        pymongo.MongoClient(mongo_url).drop_database(db)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from browser_session()


def _drawing(driver: Any) -> dict[str, float]:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 30, poll_frequency=0.2).until(
        lambda d: d.execute_script("var s = document.getElementById('statechart'); return s && s.dataset.drawn")
    )
    assert driver.execute_script("return document.getElementById('statechart').dataset.drawn") == "true"
    return driver.execute_script(  # type: ignore[no-any-return]
        "var svg = document.querySelector('#statechart svg'); var r = svg.getBoundingClientRect();"
        "var v = svg.viewBox.baseVal;"
        "return {height: r.height, width: r.width, natural_height: v.height, natural_width: v.width,"
        " details: document.getElementById('summary').getBoundingClientRect().top};"
    )


def test_a_small_chart_is_drawn_at_its_own_size(dash: Dashboard, browser: Any) -> None:
    browser.get(f"{dash.base}/execution?id=t-1&token={TOKEN}")
    size = _drawing(browser)
    assert 0 < size["height"] <= MAX_HEIGHT, size
    # no larger than Mermaid drew it: a small chart is not stretched to the page's width
    assert size["width"] <= size["natural_width"] + 1 and size["height"] <= size["natural_height"] + 1, size
    # the execution's details start within the first screen (the window is 1,000 px tall)
    assert size["details"] < 1000, size


def test_the_height_bound_holds_in_a_narrow_window(dash: Dashboard, browser: Any) -> None:
    browser.set_window_size(500, 900)
    try:
        browser.get(f"{dash.base}/execution?id=t-1&token={TOKEN}")
        size = _drawing(browser)
        assert 0 < size["height"] <= MAX_HEIGHT and size["width"] <= 500, size
    finally:
        browser.set_window_size(1400, 1000)
