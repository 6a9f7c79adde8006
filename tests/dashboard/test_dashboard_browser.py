"""The dashboard as a person uses it: `harel-beanie dashboard` serving the demo's executions,
driven in a real headless Chromium (Debian's, through selenium). Open the list, filter it,
open an execution and read its timeline, find the failed one and its error; a request
without the token is refused."""

from __future__ import annotations

import json
import re
import time
from typing import Any, Iterator

import pymongo
import pytest
from harel.engine.execution import Execution, Status

from harel_beanie import MongoStore
from tests.commands.test_cli import run_cli
from tests.support.browser import Dashboard, browser_missing, browser_session, chrome, profile_dir

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))

TOKEN = "t0k-" + "x" * 20


@pytest.fixture(scope="module")
def shop(mongo_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A database holding a demo run, one dead-lettered order and one silent running one,
    and the standalone dashboard over it."""
    db = "hbt_dash_" + str(int(time.time() * 1000))[-9:]
    proc = run_cli("demo", "-n", "27", "--url", mongo_url, "--db", db, cwd=tmp_path_factory.mktemp("demo"))
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    run_id = re.search(r"Run (demo-[0-9a-f]{6})", proc.stdout).group(1)  # type: ignore[union-attr]
    store = MongoStore(pymongo.MongoClient(mongo_url), db)
    now = time.time()
    store.save(
        Execution(
            id="broken-order-1",
            definition_id="Order",
            status=Status.FAILED,
            active_path="Paying",
            error="ValueError: gateway answered 502",
            updated_at=now - 60,
            context={"order_id": "B-1"},
        )
    )
    store.save(
        Execution(
            id="quiet-order-1",
            definition_id="Order",
            status=Status.RUNNING,
            active_path="CoolingOff",
            updated_at=now - 3 * 3600,
        )
    )
    store.close()
    dash = Dashboard(mongo_url, db, TOKEN).wait()
    try:
        yield {"dash": dash, "run_id": run_id, "db": db, "mongo_url": mongo_url}
    finally:
        dash.stop()
        pymongo.MongoClient(mongo_url).drop_database(db)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from browser_session()


def _click_and_load(driver: Any, by: str, value: str) -> None:
    """Click a control that loads a new page, and wait until the address has changed: reading
    the page before that would read the old one."""
    from selenium.webdriver.support.ui import WebDriverWait

    before = driver.current_url
    driver.find_element(by, value).click()
    WebDriverWait(driver, 20).until(lambda d: d.current_url != before)


def _rows(driver: Any, table: str = "executions") -> list[dict[str, str]]:
    from selenium.webdriver.common.by import By

    out = []
    for tr in driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr[data-id]"):
        cells = [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        out.append({"id": tr.get_attribute("data-id"), "definition": cells[1], "status": cells[2], "outcome": cells[3]})
    return out


def test_browse_filter_open_and_see_a_failed_one(shop: dict[str, Any], browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    dash, run_id = shop["dash"], shop["run_id"]
    # the link the command prints: the token moves into a cookie, out of the address bar
    browser.get(f"{dash.base}/?token={TOKEN}")
    assert "token=" not in browser.current_url
    assert browser.find_element(By.TAG_NAME, "h1").text.startswith("Executions")
    rows = _rows(browser)
    total = int(browser.find_element(By.ID, "total").text.split()[0])
    assert len(rows) == total >= 27
    counts = browser.find_element(By.ID, "status-counts").text
    assert "DONE" in counts and "FAILED 1" in counts and "RUNNING 1" in counts

    # pages of 10: the next page starts after the last id of this one
    browser.get(f"{dash.base}/?limit=10")
    first = [r["id"] for r in _rows(browser)]
    _click_and_load(browser, By.ID, "next")
    second = [r["id"] for r in _rows(browser)]
    assert len(first) == len(second) == 10 and second[0] > first[-1]

    # filter: the Order roots that are done
    Select(browser.find_element(By.ID, "f-definition")).select_by_value("Order")
    Select(browser.find_element(By.ID, "f-status")).select_by_value("DONE")
    browser.find_element(By.ID, "f-roots").click()
    _click_and_load(browser, By.ID, "apply")
    assert "status=DONE" in browser.current_url and "definition=Order" in browser.current_url
    rows = _rows(browser)
    assert rows and all(r["status"] == "DONE" and r["definition"] == "Order" for r in rows)
    assert all(r["id"].startswith(f"{run_id}-order-") and ":" not in r["id"] for r in rows)
    assert {r["outcome"] for r in rows} >= {"success", "failed", "cancelled"}

    # open a delivered order: its state, context, children and its trace as a timeline
    delivered = f"{run_id}-order-0000"
    _click_and_load(browser, By.LINK_TEXT, delivered)
    assert browser.find_element(By.ID, "execution-id").text == delivered
    assert browser.find_element(By.ID, "active-path").text == "Completed"
    assert json.loads(browser.find_element(By.ID, "context").text)["order_id"] == delivered
    steps = browser.find_elements(By.CSS_SELECTOR, "#timeline li.step")
    assert len(steps) >= 5
    assert "Start" in steps[0].text and "Delivered" in steps[-1].text and "InTransit → Completed" in steps[-1].text
    children = _rows(browser, "children")
    assert any(c["definition"] == "pay.Payment" for c in children)

    # the failed queue holds the dead-lettered order; its page shows the error
    _click_and_load(browser, By.LINK_TEXT, "Failed & silent")
    assert [r["id"] for r in _rows(browser, "failed")] == ["broken-order-1"]
    assert "quiet-order-1" in browser.find_element(By.ID, "silent").text
    _click_and_load(browser, By.LINK_TEXT, "broken-order-1")
    assert browser.find_element(By.ID, "status").text == "FAILED"
    assert "gateway answered 502" in browser.find_element(By.ID, "error-record").text

    # the backlog page
    _click_and_load(browser, By.LINK_TEXT, "Backlog")
    assert "Order" in browser.find_element(By.ID, "by-definition").text


def test_without_the_token_every_page_is_refused(shop: dict[str, Any]) -> None:
    dash = shop["dash"]
    for path in (
        "/",
        "/failed",
        "/backlog",
        "/execution?id=broken-order-1",
        "/api/execution?id=broken-order-1",
        "/api/executions",
        "/api/backlog",
        "/metrics",
    ):
        assert dash.get(path)[0] == 401, path
        assert dash.get(path, token="wrong")[0] == 401, path
    assert dash.get("/api/executions?status=FAILED", token=TOKEN)[0] == 200


def test_a_browser_without_the_token_is_refused(shop: dict[str, Any]) -> None:
    from selenium.webdriver.common.by import By

    for profile in profile_dir():  # a browser that never received the cookie
        driver = chrome(profile)
        try:
            driver.get(shop["dash"].base + "/")
            body = driver.find_element(By.TAG_NAME, "body").text
            # a page saying how to get in, not the JSON a script gets
            assert "This dashboard needs its token" in body and "harel-beanie dashboard" in body, body
            assert "Executions" not in body and '"detail"' not in body
        finally:
            driver.quit()


def test_the_json_views_are_in_the_openapi_schema(shop: dict[str, Any]) -> None:
    dash = shop["dash"]
    status, body = dash.get("/openapi.json", token=TOKEN)
    assert status == 200
    schema = json.loads(body)
    for path, model in (
        ("/api/executions", "ExecutionsView"),
        ("/api/execution", "ExecutionView"),
        ("/api/failed", "FailedView"),
        ("/api/backlog", "BacklogView"),
    ):
        ok = schema["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok == {"$ref": f"#/components/schemas/{model}"}, (path, ok)
    page = json.loads(shop["dash"].get("/api/executions?definition=Order&status=DONE&limit=5", token=TOKEN)[1])
    assert len(page["rows"]) == 5 and page["next_after"] == page["rows"][-1]["id"]
    nxt = json.loads(
        shop["dash"].get(
            f"/api/executions?definition=Order&status=DONE&limit=5&after={page['next_after']}", token=TOKEN
        )[1]
    )
    assert nxt["rows"][0]["id"] > page["rows"][-1]["id"]
