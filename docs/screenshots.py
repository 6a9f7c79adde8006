"""Screenshots of the dashboard's pages into docs/ (`make screenshots`).

Starts a throwaway embedded server and fills it with the demo's shop: `ROUNDS` demo runs, a
chart sample taken after each as if the runs had been a minute apart (the charts draw the last
hour from a sample a minute, and a script cannot wait an hour), one order stopped in its fork
(the demo ends every order; this one is shaped as a delivered order's regions were, its
warehouse packing, its invoice issued) and one dead-lettered order for the failed queue. Then
serves `harel-beanie dashboard` over it and photographs, in Debian's headless chromium (`make
browser` installs it), each page whole:

- `dashboard-executions.png`: the front page, its charts drawn;
- `dashboard-search.png`: a search (a definition, a status and a time range, in the form);
- `dashboard-execution.png`: the order in its fork, its statechart drawn (the script waits
  until mermaid has drawn it: the diagram element gets `data-drawn`);
- `dashboard-failed.png`, `dashboard-backlog.png`: the failed queue, the backlog.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pymongo
from harel.engine.execution import Execution, Status
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.core.documents import bind
from harel_beanie.dashboard.charts import samples_name, take_sample
from harel_beanie.deploy.embedded import EmbeddedServer, free_port

DOCS = Path(__file__).resolve().parent
TOKEN = "screenshots"
DB = "shop"
#: demo runs, a sample after each: the charts' minutes
ROUNDS = 12
WIDTH = 1360
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--hide-scrollbars",
    f"--window-size={WIDTH},900",
)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "harel_beanie", *args]


async def sample(url: str, minute: float) -> None:
    """The dashboard's own sample of the store, stamped `minute`."""
    store = AsyncMongoStore(pymongo.AsyncMongoClient(url), DB)
    await store.init()
    doc = bind(store.settings.prefix)[0]
    await take_sample(doc, doc.get_pymongo_collection().database[samples_name(store.settings.prefix)], now=minute)
    await store.close()


def fill(url: str, work: Path) -> str:
    """The demo's shop, sampled a minute apart; returns the first run's id."""
    now = time.time()
    first = ""
    for i in range(ROUNDS):
        done = subprocess.run(
            cli("demo", "-n", "16", "--url", url, "--db", DB), cwd=work, capture_output=True, text=True
        )
        if done.returncode != 0:
            sys.exit(done.stdout + done.stderr)
        first = first or re.search(r"Run (demo-[0-9a-f]+)", done.stdout).group(1)  # type: ignore[union-attr]
        minute = now - now % 60 - 60 * (ROUNDS - 1 - i)
        asyncio.run(sample(url, minute))
    return first


def forked_order(url: str, delivered: str) -> str:
    """An order stopped in its fork, made from `delivered`: its trace up to the fork, its
    payment, and its regions, the warehouse's packing, the invoice's issued."""
    executions: Any = pymongo.MongoClient(url)[DB]["harel_executions"]
    root = executions.find_one({"_id": delivered})
    assert root is not None, delivered
    store = MongoStore(pymongo.MongoClient(url), DB)
    forked = "order-4410"
    store.save(
        Execution(
            id=forked,
            definition_id="Order",
            status=Status.RUNNING,
            active_path="Fulfilment",
            created_at=root["created_at"],
            updated_at=time.time() - 90,
            context={"order_id": forked, "amount": 24.5, "lines": ["SKU-3", "SKU-4"]},
        )
    )
    for step in store.read_trace(delivered):
        store.append_trace(forked, {k: v for k, v in step.items() if k != "index"})
        if step.get("to_path") == "Fulfilment":
            break
    for child in executions.find({"parent_id": delivered}):
        packing = child["definition_id"] == "Order" and ".Warehouse." in child["active_path"] + "."
        store.save(
            Execution(
                id=forked + child["_id"][len(delivered) :],
                definition_id=child["definition_id"],
                parent_id=forked,
                status=Status.RUNNING if packing else Status(child["status"]),
                outcome=None if packing else child.get("outcome"),
                updated_at=time.time() - 60,
                active_path="Fulfilment.Warehouse.Packing" if packing else child["active_path"],
            )
        )
    store.save(
        Execution(
            id="order-7731",
            definition_id="Order",
            status=Status.FAILED,
            active_path="Paying",
            error="ConnectionError: payment gateway timed out after 30s",
            updated_at=time.time() - 420,
            context={"order_id": "order-7731", "amount": 59.7, "lines": ["SKU-2", "SKU-9"]},
        )
    )
    store.close()
    return forked


def search(url: str, run_id: str) -> str:
    """The query string of a search: the run's delivered orders, in the first half of its span."""
    executions: Any = pymongo.MongoClient(url)[DB]["harel_executions"]
    times = sorted(
        d["updated_at"]
        for d in executions.find({"_id": {"$regex": f"^{run_id}-order-"}, "definition_id": "Order", "status": "DONE"})
    )
    iso = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))  # noqa: E731
    span = {"from": iso(times[0] - 1), "to": iso(times[len(times) // 2] + 1)}
    return urlencode({"definition": "Order", "status": "DONE", "outcome": "success", **span})


def shoot(driver: Any, url: str, name: str, ready: str = "") -> None:
    """Open `url`, wait for `ready` (a script returning true) if given, and photograph the page
    whole (the window as tall as the page, up to 2,400 pixels)."""
    driver.set_window_size(WIDTH, 900)
    driver.get(url)
    if ready:
        WebDriverWait(driver, 60, poll_frequency=0.2).until(lambda d: d.execute_script(ready))
    height = min(int(driver.execute_script("return document.documentElement.scrollHeight")), 2400)
    driver.set_window_size(WIDTH, max(height, 600))
    time.sleep(0.3)  # the resize laid out
    driver.save_screenshot(str(DOCS / name))
    print(f"wrote docs/{name}")


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="hb-screens-"))
    with EmbeddedServer() as server:
        run_id = fill(server.url, work)
        forked = forked_order(server.url, f"{run_id}-order-0000")
        port = free_port()
        dash = subprocess.Popen(
            cli("dashboard", "--url", server.url, "--db", DB, "--port", str(port), "--token", TOKEN),
            cwd=work,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={work / 'profile'}")
        driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(100):
                try:
                    driver.get(f"{base}/?token={TOKEN}")
                    if "Executions" in driver.title:
                        break
                except Exception:
                    pass
                time.sleep(0.3)
            drawn = "return document.getElementById('statechart').getAttribute('data-drawn') === 'true'"
            charted = "return Number(document.getElementById('charts').getAttribute('data-samples')) >= 2"
            shoot(driver, f"{base}/?limit=12", "dashboard-executions.png", charted)
            shoot(driver, f"{base}/?{search(server.url, run_id)}", "dashboard-search.png")
            shoot(driver, f"{base}/execution?id={forked}", "dashboard-execution.png", drawn)
            shoot(driver, f"{base}/failed", "dashboard-failed.png")
            shoot(driver, f"{base}/backlog", "dashboard-backlog.png")
        finally:
            driver.quit()
            dash.terminate()
            dash.wait(timeout=15)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
