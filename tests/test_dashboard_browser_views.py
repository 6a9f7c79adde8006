"""The operator's view in a real browser (Debian's headless Chromium, through selenium), over
the standalone `harel-beanie dashboard` serving a demo run:

- the statechart: an order's page draws its definition, and the states the DOM marks active
  are exactly the order's active configuration (a completed one: its final state; one in its
  fork: its regions' states, read from its child executions);
- live pages: a commit the test makes appears on an open page without a reload;
- the charts: one line per series, with as many points as the samples allow;
- search: an id prefix typed into the form lists only those ids, at a URL that gives the same
  page again.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pymongo
import pytest
from harel.engine.execution import Execution, Status

from harel_beanie import MongoStore
from tests.browser import browser_missing
from tests.test_dashboard_browser import TOKEN, _click_and_load, _rows, browser, shop  # noqa: F401 (fixtures)

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))


def _wait(driver: Any, predicate: Any, timeout: float = 30.0) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: predicate(d))


def _drawn(driver: Any) -> None:
    from selenium.webdriver.common.by import By

    _wait(driver, lambda d: d.find_element(By.ID, "statechart").get_attribute("data-drawn") in ("true", "failed"))
    assert driver.find_element(By.ID, "statechart").get_attribute("data-drawn") == "true", driver.find_element(
        By.ID, "statechart"
    ).text


def _active_labels(driver: Any) -> set[str]:
    """The labels of the states the drawn SVG marks active (Mermaid puts a classDef's name on
    the state's group)."""
    labels = driver.execute_script(
        "return Array.from(document.querySelectorAll('#statechart svg g.active')).map(g => g.textContent.trim())"
    )
    return {label.split(" (")[0] for label in labels if label}


def test_the_statechart_highlights_the_active_configuration(shop: dict[str, Any], browser: Any) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    dash, run_id = shop["dash"], shop["run_id"]
    browser.get(f"{dash.base}/?token={TOKEN}")
    delivered = f"{run_id}-order-0000"
    browser.get(f"{dash.base}/execution?id={delivered}")
    _drawn(browser)
    assert _active_labels(browser) == {"Completed"}
    assert "InTransit → Completed" in browser.find_element(By.ID, "last-transition").text
    visited = browser.execute_script(
        "return Array.from(document.querySelectorAll('#statechart svg g.visited')).map(g => g.textContent.trim())"
    )
    assert any(v.startswith("InTransit") for v in visited)
    # each child execution is linked from the state that started it
    links = browser.find_elements(By.CSS_SELECTOR, "#state-paths li[data-path='Paying'] a.child-link")
    assert links and links[0].text.startswith(f"↳ {delivered}:Paying")
    # an order in its fork: the active states are its regions' (its child executions')
    store = MongoStore(pymongo.MongoClient(shop["mongo_url"]), shop["db"])
    forked = [e for e in store.list_executions(limit=500).items
              if e.definition_id == "Order" and e.active_path == "Fulfilment"]  # fmt: skip
    store.close()
    if forked:
        browser.get(f"{dash.base}/execution?id={forked[0].id}")
        _drawn(browser)
        active = _active_labels(browser)
        assert "Fulfilment" in active and {"Warehouse", "Invoicing"} <= active


def test_a_commit_appears_on_an_open_page_without_a_reload(shop: dict[str, Any], browser: Any) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    dash = shop["dash"]
    browser.get(f"{dash.base}/?token={TOKEN}")
    browser.get(f"{dash.base}/?prefix=live-")
    assert _rows(browser) == []
    browser.execute_script("window.__notReloaded = true")
    store = MongoStore(pymongo.MongoClient(shop["mongo_url"]), shop["db"])
    new_id = f"live-{uuid.uuid4().hex[:6]}"
    store.save(Execution(id=new_id, definition_id="Order", status=Status.RUNNING, updated_at=time.time()))
    store.close()
    _wait(browser, lambda d: [r["id"] for r in _rows(d)] == [new_id], timeout=40)
    assert browser.execute_script("return window.__notReloaded") is True
    assert "read at" in browser.find_element(By.ID, "read-at").text


def test_the_charts_draw_the_samples(shop: dict[str, Any], browser: Any) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    dash = shop["dash"]
    samples = pymongo.MongoClient(shop["mongo_url"])[shop["db"]]["harel_hb_samples"]
    now = time.time()
    minute = now - now % 60
    for i in range(8):  # eight minutes of samples, the last one this minute
        at = minute - 60 * (7 - i)
        samples.replace_one({"_id": at}, {"_id": at, "executions": 100 + 5 * i, "commits": 1000 + 40 * i,
                                          "finished": 50 + 3 * i, "failed": 2, "outbox_age": 1.0 * i,
                                          "timer_lag": 0.5}, upsert=True)  # fmt: skip
    browser.get(f"{dash.base}/?token={TOKEN}")
    charts = browser.find_elements(By.CSS_SELECTOR, "#charts figure.chart")
    assert len(charts) == 6
    points = {f.get_attribute("data-series"): len(f.find_element(By.TAG_NAME, "polyline").get_attribute("points").split())
              for f in charts}  # fmt: skip
    # a rate needs two samples: seven for the rates, eight for the levels
    assert points["events handled"] == 7 and points["oldest outbox entry"] == 8, points
    assert "40/min" in browser.find_element(By.CSS_SELECTOR, "figure[data-series='events handled']").text


def test_search_by_id_prefix_is_a_shareable_url(shop: dict[str, Any], browser: Any) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    dash, run_id = shop["dash"], shop["run_id"]
    browser.get(f"{dash.base}/?token={TOKEN}")
    field = browser.find_element(By.ID, "f-prefix")
    field.clear()
    field.send_keys(f"{run_id}-order-000")
    _click_and_load(browser, By.ID, "apply")
    assert "prefix=" in browser.current_url
    ids = [r["id"] for r in _rows(browser)]
    assert ids and all(i.startswith(f"{run_id}-order-000") for i in ids)
    shared = browser.current_url
    browser.get(shared)
    assert [r["id"] for r in _rows(browser)] == ids
