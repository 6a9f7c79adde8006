"""Hostile ids and data in a real browser: `harel-beanie dashboard` with every action turned on,
over a database seeded with executions whose ids and contexts hold markup, script, quotes and
anything else harel allows (tests/support/seeds.py), driven in Debian's headless Chromium.

Every page and every execution's page is opened through the links the pages build, every
action form is opened: no dialog opens, no injected script runs (a payload would set
`window.__pwned` or open an alert), no element carries an inline handler, and each page shows
exactly the execution its link named. Then an action is sent on the script-shaped id: the one
dialog is the dashboard's own question, showing the id as plain text. The empty id's link on
the list is seen (a placeholder for its text) and, clicked, opens the empty id's page.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Iterator
from urllib.parse import urlsplit

import pymongo
import pytest

from harel_beanie import AsyncMongoStore
from harel_beanie.deploy.loader import default_models_dir
from tests.support.browser import Dashboard, browser_missing, browser_session
from tests.support.seeds import HOSTILE_IDS, seed_everything

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))

TOKEN = "hostile-" + "y" * 20
MODELS = default_models_dir()  # the shop models, shipped in the package
CANARIES = [
    "x');window.__pwned=1;('",
    '<img src=x onerror="window.__pwned=1">',
    "</script><script>window.__pwned=1</script>",
]
XSS = "q');alert(1);('"


@pytest.fixture(scope="module")
def hostile_dashboard(mongo_url: str) -> Iterator[tuple[Dashboard, list[str]]]:
    db = f"hbt_hostile_dash_{uuid.uuid4().hex[:8]}"

    async def seed() -> list[str]:
        store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db)
        seeded = await seed_everything(store, mongo_url, db, largest=False)
        from harel.engine.execution import Execution, Status

        for i in CANARIES:  # payloads that leave a trace if they ever run
            await store.save(Execution(id=i, definition_id=i, status=Status.FAILED, active_path=i, context={"x": i}))
        await store.close()
        return [*seeded.executions, *CANARIES]

    ids = asyncio.run(seed())
    dash = Dashboard(mongo_url, db, TOKEN, "--allow", "send,cancel,redrive", "--definitions", str(MODELS)).wait()
    try:
        yield dash, ids
    finally:
        dash.stop()
        pymongo.MongoClient(mongo_url).drop_database(db)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from browser_session()


def _clean(driver: Any, where: str) -> None:
    """No dialog open, no payload ran, no inline handler anywhere in the DOM."""
    from selenium.common.exceptions import NoAlertPresentException

    try:
        text = driver.switch_to.alert.text
    except NoAlertPresentException:
        pass
    else:
        raise AssertionError(f"{where}: a dialog opened: {text!r}")
    assert driver.execute_script("return window.__pwned === undefined"), f"{where}: an injected script ran"
    handlers = driver.execute_script(
        "return Array.from(document.querySelectorAll('*')).flatMap(e => Array.from(e.attributes))"
        ".filter(a => a.name.startsWith('on')).map(a => a.name)"
    )
    assert handlers == [], f"{where}: inline handlers {handlers}"
    # the dashboard's own script, and on an execution page the vendored mermaid that draws its
    # statechart, both files this dashboard serves: nothing inline, nothing from elsewhere
    scripts = driver.execute_script("return Array.from(document.scripts).map(s => s.src)")
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(driver.current_url))  # the standalone serves at /
    allowed = {f"{origin}/static/{name}" for name in ("dashboard.js", "mermaid.min.js")}
    assert scripts and scripts[-1].endswith("/static/dashboard.js"), (where, scripts)
    assert set(scripts) <= allowed, (where, scripts, allowed)


def test_hostile_ids_and_data_run_nothing_in_the_browser(browser: Any, hostile_dashboard: Any) -> None:
    from selenium.webdriver.common.by import By

    dash, ids = hostile_dashboard
    browser.get(f"{dash.base}/?token={TOKEN}")  # the cookie, then the list
    for path in ("/?limit=500", "/?limit=500&roots=true", "/failed", "/backlog"):
        browser.get(dash.base + path)
        _clean(browser, path)
    browser.get(dash.base + "/?limit=500")
    links = [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "#executions tbody a")]
    links = list(dict.fromkeys(h for h in links if "/execution?id=" in h))
    opened = []
    for href in links:
        browser.get(href)
        _clean(browser, href)
        opened.append(browser.find_element(By.ID, "execution-id").get_attribute("data-id"))
        for summary in browser.find_elements(By.CSS_SELECTOR, "details.action > summary"):
            summary.click()  # open the form: opening it must not run anything either
        _clean(browser, href + " (forms open)")
    # what a page shows of an id: the text a browser renders (spaces collapsed, NUL replaced)
    assert len(opened) == len(set(ids)) - 0 and set(CANARIES) <= set(opened)
    assert {i for i in HOSTILE_IDS if i.strip() == i and "\x00" not in i and "\n" not in i and "\t" not in i} <= set(
        opened
    )


def test_the_only_dialog_is_the_dashboards_own_question(browser: Any, hostile_dashboard: Any) -> None:
    from urllib.parse import quote

    from selenium.webdriver.common.by import By

    dash, _ = hostile_dashboard
    browser.get(f"{dash.base}/?token={TOKEN}")
    browser.get(f"{dash.base}/execution?id={quote(XSS, safe='')}")
    _clean(browser, "before the action")
    send = [d for d in browser.find_elements(By.CSS_SELECTOR, "details.action") if "Send" in d.text][0]
    send.find_element(By.TAG_NAME, "summary").click()
    send.find_element(By.NAME, "kind").send_keys("Nudge")
    field = send.find_element(By.NAME, "confirm")
    field.send_keys(field.get_attribute("placeholder"))
    send.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    dialog = browser.switch_to.alert
    assert dialog.text == f"Send this event to {XSS}?"  # the id shown as text inside the question
    dialog.accept()
    deadline = time.monotonic() + 30
    while "done=" not in browser.current_url and "error=" not in browser.current_url and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"id={quote(XSS, safe='')}" in browser.current_url
    assert browser.find_element(By.ID, "execution-id").get_attribute("data-id") == XSS
    _clean(browser, "after the action")


def test_the_empty_ids_link_is_seen_clicked_and_opens_it(browser: Any, hostile_dashboard: Any) -> None:
    """The empty id's link on the list had no text: a browser drew it zero pixels wide, and a
    person could not click it. Now it shows a placeholder, and a click opens the empty id's page."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    dash, _ = hostile_dashboard
    browser.get(f"{dash.base}/?token={TOKEN}")
    browser.get(f"{dash.base}/?limit=500")
    link = browser.find_element(By.CSS_SELECTOR, '#executions tbody tr[data-id=""] td:first-child a')
    assert link.is_displayed() and link.size["width"] > 0 and link.text == "(empty id)"
    blank = browser.find_element(By.CSS_SELECTOR, '#executions tbody tr[data-id="   "] td:first-child a')
    assert blank.is_displayed() and blank.text == "(blank id)"
    before = browser.current_url
    link.click()
    WebDriverWait(browser, 20).until(lambda d: d.current_url != before)
    assert browser.current_url == f"{dash.base}/execution?id="
    assert browser.find_element(By.ID, "execution-id").get_attribute("data-id") == ""
    assert "(empty id)" in browser.find_element(By.TAG_NAME, "h1").text
    _clean(browser, "the empty id's page")


def test_an_action_on_the_empty_id_can_be_confirmed(browser: Any, hostile_dashboard: Any) -> None:
    """The empty id typed again is nothing: the confirmation field was `required`, so the
    browser refused to send the form and Send and Cancel could not be confirmed. Now the
    form goes, its confirmation is accepted, and the action reaches harel's runner (which
    refuses this one: its machine, 'Hostile', is not among the definitions, which the page says)."""
    from selenium.webdriver.common.by import By

    dash, _ = hostile_dashboard
    browser.get(f"{dash.base}/?token={TOKEN}")
    browser.get(f"{dash.base}/execution?id=")
    assert "this one is empty: leave the field as it is" in browser.find_element(By.TAG_NAME, "main").text
    cancel = [d for d in browser.find_elements(By.CSS_SELECTOR, "details.action") if "Cancel" in d.text][0]
    cancel.find_element(By.TAG_NAME, "summary").click()
    cancel.find_element(By.CSS_SELECTOR, "button[type=submit]").click()  # the id, typed: nothing
    browser.switch_to.alert.accept()  # the dashboard's own question: the form is being sent
    deadline = time.monotonic() + 30
    while "/execution/cancel" not in browser.current_url and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "error=confirm" not in browser.current_url, browser.current_url
    reached = [e.text for e in browser.find_elements(By.ID, "error")]
    refused = "the runner does not know the machine 'Hostile': it is not among its definitions"
    assert browser.current_url.endswith("done=cancel") or reached == [refused], (browser.current_url, reached)
