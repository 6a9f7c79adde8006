"""The operator's view in a real browser (Debian's headless Chromium, through selenium), over
the standalone `harel-beanie dashboard` serving a demo run:

- the statechart: an order's page draws its definition, and the states the DOM marks active
  are exactly the order's active configuration (a completed one: its final state; one in its
  fork: its regions' states, read from its child executions); the states it passed through
  are marked, the last transition named, each child linked from the state that started it;
  it is drawn without one inline style for the page's policy to refuse: the console stays empty;
- live pages: a commit the test makes appears without a reload on an open executions list,
  execution page, failed queue and backlog, and each says when it read again; a hidden tab
  closes its connection, reads nothing while hidden, and reads again when shown;
- the charts: one line per series, with as many points as the samples allow;
- search: an id prefix typed into the form, and a definition, a status and a time range
  (from / to) chosen in it, list exactly the matching ids, at a URL that gives the same page
  again; so do an outcome and a parent (children of) in the address; cursor pages stay stable
  while executions are created and changed between them.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import pymongo
import pytest
from harel.engine.execution import Execution, Status

from harel_beanie import MongoStore
from harel_beanie.core.time_order import TIME_SORT
from tests.dashboard.test_dashboard_browser import TOKEN, _click_and_load, _rows, browser, shop  # noqa: F401 (fixtures)
from tests.support.browser import browser_missing

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))


def _wait(driver: Any, predicate: Any, timeout: float = 30.0) -> Any:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # a live page replaces its table when it reads again: an element found just before that is
    # stale when read, and the next poll reads the new one
    ignored = (StaleElementReferenceException, NoSuchElementException)
    return WebDriverWait(driver, timeout, poll_frequency=0.2, ignored_exceptions=ignored).until(lambda d: predicate(d))


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
    # the page's policy drops the drawing's own style, so its look is dashboard.css's: no box
    # is left in SVG's default black fill, where its label cannot be read
    black = browser.execute_script(
        "return Array.from(document.querySelectorAll('#statechart svg rect, #statechart svg circle'))"
        ".filter(e => e.getBBox().width > 0 && getComputedStyle(e).fill === 'rgb(0, 0, 0)')"
        ".map(e => e.getAttribute('class') + ' in ' + e.parentNode.parentNode.getAttribute('class'))"
    )
    assert black == [], black
    assert "InTransit → Completed" in browser.find_element(By.ID, "last-transition").text
    visited = browser.execute_script(
        "return Array.from(document.querySelectorAll('#statechart svg g.visited')).map(g => g.textContent.trim())"
    )
    assert any(v.startswith("InTransit") for v in visited)
    # each child execution is linked from the state that started it
    links = browser.find_elements(By.CSS_SELECTOR, "#state-paths li[data-path='Paying'] a.child-link")
    assert links and links[0].text.startswith(f"↳ {delivered}:Paying")
    # an order in its fork: the active states are its regions' (its child executions'). The
    # demo ends every order, so one is made mid-fork, its regions shaped as the delivered
    # order's were: the warehouse packing (waiting for its parcel), the invoice issued
    executions = pymongo.MongoClient(shop["mongo_url"])[shop["db"]]["harel_executions"]
    regions = list(executions.find({"parent_id": delivered, "definition_id": "Order"}))
    assert sorted(d["active_path"].split(".")[1] for d in regions) == ["Invoicing", "Warehouse"], regions
    forked = f"fork-{uuid.uuid4().hex[:6]}"
    store = MongoStore(pymongo.MongoClient(shop["mongo_url"]), shop["db"])
    store.save(
        Execution(
            id=forked, definition_id="Order", status=Status.RUNNING, active_path="Fulfilment", updated_at=time.time()
        )
    )
    for d in regions:
        packing = ".Warehouse." in d["active_path"] + "."
        store.save(
            Execution(
                id=forked + d["_id"][len(delivered) :],
                definition_id="Order",
                parent_id=forked,
                status=Status.RUNNING if packing else Status.DONE,
                active_path="Fulfilment.Warehouse.Packing" if packing else d["active_path"],
                updated_at=time.time(),
            )
        )
    store.close()
    browser.get(f"{dash.base}/execution?id={forked}")
    _drawn(browser)
    active = _active_labels(browser)
    assert {"Fulfilment", "Warehouse", "Packing", "Invoicing", "Issued"} <= active, active
    assert not active & {"Picking", "Packed", "Issuing", "InTransit", "Completed"}, active


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

    def drawn() -> dict[str, int]:
        browser.get(f"{dash.base}/?token={TOKEN}")
        charts = browser.find_elements(By.CSS_SELECTOR, "#charts figure.chart")
        assert len(charts) == 6
        return {
            f.get_attribute("data-series"): len(f.find_element(By.TAG_NAME, "polyline").get_attribute("points").split())
            for f in charts
        }

    # right after the demo, its last hour is drawn: it took a sample at each minute of its
    # clock, and its clock ended when it started (it used to end days back: empty charts)
    demos = drawn()
    assert min(demos.values()) >= 55, demos
    samples.delete_many({})  # the test's own samples below, alone
    now = time.time()
    minute = now - now % 60
    for i in range(8):  # eight minutes of samples, the last one this minute
        at = minute - 60 * (7 - i)
        samples.replace_one(
            {"_id": at},
            {
                "_id": at,
                "executions": 100 + 5 * i,
                "active": 40,
                "finished": 50 + 3 * i,
                "failed": 2,
                "outbox_age": 1.0 * i,
                "timer_lag": 0.5,
            },
            upsert=True,
        )
    points = drawn()
    # a rate needs two samples: seven for the rates, eight for the levels
    assert points["started"] == 7 and points["oldest outbox entry"] == 8, points
    assert points["executions committing"] == 8, points  # a level: each sample's own minute
    assert "40/min" in browser.find_element(By.CSS_SELECTOR, "figure[data-series='executions committing']").text


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


def test_search_by_definition_status_and_time_range_through_the_form(shop: dict[str, Any], browser: Any) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    dash, run_id = shop["dash"], shop["run_id"]
    executions = pymongo.MongoClient(shop["mongo_url"])[shop["db"]]["harel_executions"]
    # a record written without its timestamps (harel's own, from before they existed) has no
    # place in a time range: the search leaves it out, and so does the expectation
    dated = {"definition_id": "Order", "status": "DONE", "updated_at": {"$ne": None}}
    done = sorted(d["updated_at"] for d in executions.find(dated))
    start, end = math.floor(done[0]), math.floor(done[len(done) // 2]) + 1  # about the first half, whole seconds
    iso = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))  # noqa: E731  (the form reads UTC)
    span = {"definition_id": "Order", "status": "DONE", "updated_at": {"$gte": start, "$lt": end}}
    wanted = [d["_id"] for d in executions.find(span, {"_id": 1}).sort(TIME_SORT)]  # newest first
    assert wanted and len(wanted) < len(done)
    browser.get(f"{dash.base}/?token={TOKEN}")
    Select(browser.find_element(By.ID, "f-definition")).select_by_value("Order")
    Select(browser.find_element(By.ID, "f-status")).select_by_value("DONE")
    for field, value in (("f-from", iso(start)), ("f-to", iso(end))):
        browser.find_element(By.ID, field).clear()
        browser.find_element(By.ID, field).send_keys(value)
    _click_and_load(browser, By.ID, "apply")
    for part in ("definition=Order", "status=DONE", "from=", "to="):
        assert part in browser.current_url, browser.current_url
    ids = [r["id"] for r in _rows(browser)]
    assert ids == wanted and all(i.startswith(f"{run_id}-order-") for i in ids)
    assert browser.find_element(By.ID, "total").text == f"{len(wanted)} matching"
    shared = browser.current_url
    browser.get(f"{dash.base}/")
    browser.get(shared)
    assert [r["id"] for r in _rows(browser)] == ids
    assert browser.find_element(By.ID, "f-from").get_attribute("value") == iso(start)


def test_search_by_outcome_and_by_parent(shop: dict[str, Any], browser: Any) -> None:  # noqa: F811
    dash, run_id = shop["dash"], shop["run_id"]
    executions = pymongo.MongoClient(shop["mongo_url"])[shop["db"]]["harel_executions"]
    browser.get(f"{dash.base}/?token={TOKEN}")
    browser.get(f"{dash.base}/?definition=Order&outcome=failed")
    rows = _rows(browser)
    assert rows and {(r["definition"], r["outcome"]) for r in rows} == {("Order", "failed")}
    assert [r["id"] for r in rows] == sorted(
        d["_id"] for d in executions.find({"definition_id": "Order", "outcome": "failed"}, {"_id": 1})
    )
    delivered = f"{run_id}-order-0000"
    browser.get(f"{dash.base}/?parent={delivered}")
    kids = [r["id"] for r in _rows(browser)]
    assert kids == sorted(d["_id"] for d in executions.find({"parent_id": delivered}, {"_id": 1}))
    assert len(kids) >= 3 and all(k.startswith(f"{delivered}:") for k in kids)  # its payment and its two regions


def test_cursor_pages_stay_stable_while_executions_change(shop: dict[str, Any], browser: Any) -> None:  # noqa: F811
    """The next page is read after the last id of the page shown (a keyset), so executions
    created before the cursor or changed meanwhile neither shift it nor repeat a row."""
    from selenium.webdriver.common.by import By

    dash = shop["dash"]
    tag = f"page-{uuid.uuid4().hex[:6]}-"
    store = MongoStore(pymongo.MongoClient(shop["mongo_url"]), shop["db"])
    for i in range(12):
        store.save(Execution(id=f"{tag}{i:02d}", definition_id="Order", status=Status.RUNNING, updated_at=time.time()))
    browser.get(f"{dash.base}/?token={TOKEN}")
    browser.get(f"{dash.base}/?prefix={tag}&limit=5")
    first = [r["id"] for r in _rows(browser)]
    assert first == [f"{tag}{i:02d}" for i in range(5)]
    next_page = browser.find_element(By.ID, "next").get_attribute("href")
    # meanwhile: one created before the cursor, one after the last page, two changed by a commit
    store.save(Execution(id=f"{tag}02b", definition_id="Order", status=Status.RUNNING, updated_at=time.time()))
    store.save(Execution(id=f"{tag}99", definition_id="Order", status=Status.RUNNING, updated_at=time.time()))
    for changed in (f"{tag}01", f"{tag}06"):
        exe = store.load(changed)
        assert exe is not None
        store.save(exe.model_copy(update={"status": Status.FAILED, "error": "changed while paging"}))
    store.close()
    browser.get(next_page)
    second = _rows(browser)
    assert [r["id"] for r in second] == [f"{tag}{i:02d}" for i in range(5, 10)]
    assert {r["id"]: r["status"] for r in second}[f"{tag}06"] == "FAILED"  # the page shows it as it is now
    _click_and_load(browser, By.ID, "next")
    assert [r["id"] for r in _rows(browser)] == [f"{tag}10", f"{tag}11", f"{tag}99"]


def _commit(where: dict[str, Any], execution_id: str, **changes: Any) -> None:
    """A commit made by the test, as a worker would make it: the execution read, changed, written."""
    store = MongoStore(pymongo.MongoClient(where["mongo_url"]), where["db"])
    exe = store.load(execution_id)
    if exe is None:
        exe = Execution(id=execution_id, definition_id="Order", status=Status.RUNNING, updated_at=time.time())
    store.save(exe.model_copy(update={"updated_at": time.time(), **changes}))
    store.close()


def _open_live(driver: Any, url: str) -> str:
    """Open a live page, marked so that a reload would show; return its "read at" line."""
    from selenium.webdriver.common.by import By

    driver.get(url)
    _wait(driver, lambda d: d.find_element(By.ID, "live-state").text.strip() == "· live")
    _wait(driver, lambda d: d.execute_script("return window.liveSource && window.liveSource.readyState === 1"))
    driver.execute_script("window.__notReloaded = true")
    return str(driver.find_element(By.ID, "read-at").text)


def _not_reloaded(driver: Any, read_at: str) -> None:
    from selenium.webdriver.common.by import By

    assert driver.execute_script("return window.__notReloaded") is True
    _wait(driver, lambda d: d.find_element(By.ID, "read-at").text != read_at)  # it says when it read again


def test_each_live_page_shows_a_commit_without_a_reload(shop: dict[str, Any], browser: Any) -> None:  # noqa: F811
    """The executions list is covered above; here an execution's page, the failed queue and
    the backlog, each open while the test commits."""
    from selenium.webdriver.common.by import By

    dash = shop["dash"]
    browser.get(f"{dash.base}/?token={TOKEN}")
    one = f"live-one-{uuid.uuid4().hex[:6]}"
    _commit(shop, one, active_path="Paying")
    read_at = _open_live(browser, f"{dash.base}/execution?id={one}")
    assert browser.find_element(By.ID, "status").text == "RUNNING"
    time.sleep(1.1)  # the "read at" line has a resolution of one second
    _commit(shop, one, status=Status.FAILED, error="gateway answered 502", context={"step": "live"})
    _wait(browser, lambda d: d.find_element(By.ID, "status").text == "FAILED", timeout=40)
    assert '"live"' in browser.find_element(By.ID, "context").text
    _not_reloaded(browser, read_at)

    read_at = _open_live(browser, f"{dash.base}/failed")
    failed = f"live-failed-{uuid.uuid4().hex[:6]}"
    assert failed not in [r["id"] for r in _rows(browser, "failed")]
    time.sleep(1.1)
    _commit(shop, failed, status=Status.FAILED, error="a dead letter")
    _wait(browser, lambda d: failed in [r["id"] for r in _rows(d, "failed")], timeout=40)
    _not_reloaded(browser, read_at)

    read_at = _open_live(browser, f"{dash.base}/backlog")
    model = f"Live{uuid.uuid4().hex[:6]}"
    assert model not in browser.find_element(By.ID, "by-definition").text
    time.sleep(1.1)
    _commit(shop, f"live-backlog-{model}", definition_id=model)
    _wait(browser, lambda d: model in d.find_element(By.ID, "by-definition").text, timeout=40)
    _not_reloaded(browser, read_at)


def test_a_hidden_tab_stops_listening_and_reads_again_when_shown(shop: dict[str, Any], browser: Any) -> None:  # noqa: F811
    dash = shop["dash"]
    browser.get(f"{dash.base}/?token={TOKEN}")
    _open_live(browser, f"{dash.base}/?prefix=hidden-")
    assert _rows(browser) == []
    assert browser.execute_script("return window.liveSource !== null")  # the page's one connection

    def visibility(hidden: bool) -> None:  # what the browser does when the tab is hidden or shown
        browser.execute_script(
            "Object.defineProperty(document, 'hidden', {configurable: true, get: () => arguments[0]});"
            "document.dispatchEvent(new Event('visibilitychange'));",
            hidden,
        )

    visibility(True)
    assert browser.execute_script("return window.liveSource === null")  # closed while hidden
    new_id = f"hidden-{uuid.uuid4().hex[:6]}"
    _commit(shop, new_id)
    time.sleep(8)  # longer than the feed's tick (5 s on a server without change streams) and its gap
    assert _rows(browser) == []  # nothing read while hidden
    visibility(False)
    _wait(browser, lambda d: [r["id"] for r in _rows(d)] == [new_id], timeout=20)  # read again when shown
    assert browser.execute_script("return window.liveSource !== null")
    assert browser.execute_script("return window.__notReloaded") is True


def test_the_statechart_draws_with_nothing_on_the_console(shop: dict[str, Any], browser: Any) -> None:  # noqa: F811
    """The page's policy admits no inline style, and mermaid styles what it draws inline: each
    such style the browser refused was a console error ("Refused to apply inline style ...
    Content Security Policy"), hundreds per statechart. The drawing is made without them, so
    an execution page with its statechart drawn leaves the console empty (the pages name no
    icon either, so a browser's first page logs no 404 for /favicon.ico)."""
    dash, run_id = shop["dash"], shop["run_id"]
    browser.get(f"{dash.base}/?token={TOKEN}")
    browser.get_log("browser")  # what earlier pages said is not this page's
    browser.get(f"{dash.base}/execution?id={run_id}-order-0000")
    _drawn(browser)
    console = [entry["message"] for entry in browser.get_log("browser")]
    assert console == [], console
