"""Screenshots of the dashboard's main pages into docs/ (`make screenshots`).

Starts a throwaway embedded server, fills it with a demo run (plus one dead-lettered order,
so the failed queue has something to show), serves `harel-beanie dashboard` over it and
photographs the pages in Debian's headless chromium (`make browser` installs it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import pymongo
from harel.engine.execution import Execution, Status
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from harel_beanie import MongoStore
from harel_beanie.ops.embedded import EmbeddedServer, free_port

DOCS = Path(__file__).resolve().parent
TOKEN = "screenshots"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic", "--hide-scrollbars", "--window-size=1360,900")  # fmt: skip


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "harel_beanie", *args]


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="hb-screens-"))
    with EmbeddedServer() as server:
        done = subprocess.run(
            cli("demo", "-n", "40", "--url", server.url, "--db", "shop"), cwd=work, capture_output=True, text=True
        )
        if done.returncode != 0:
            sys.exit(done.stdout + done.stderr)
        store = MongoStore(pymongo.MongoClient(server.url), "shop")
        store.save(Execution(id="order-7731", definition_id="Order", status=Status.FAILED, active_path="Paying",
                             error="ConnectionError: payment gateway timed out after 30s", updated_at=time.time() - 420,
                             context={"order_id": "order-7731", "amount": 59.7, "lines": ["SKU-2", "SKU-9"]}))  # fmt: skip
        store.close()
        port = free_port()
        dash = subprocess.Popen(cli("dashboard", "--url", server.url, "--db", "shop", "--port", str(port), "--token", TOKEN),
                                cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
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
            run = driver.find_element("css selector", "#executions tbody tr[data-id^='demo-']").get_attribute("data-id")
            root = run.split(":")[0].rsplit("-", 1)[0] + "-0000"
            shots = {
                "dashboard-executions.png": f"{base}/?definition=Order&roots=true",
                "dashboard-execution.png": f"{base}/execution?id={quote(root, safe='')}",
                "dashboard-failed.png": f"{base}/failed",
                "dashboard-backlog.png": f"{base}/backlog",
            }
            for name, url in shots.items():
                driver.get(url)
                driver.save_screenshot(str(DOCS / name))
                print(f"wrote docs/{name}")
        finally:
            driver.quit()
            dash.terminate()
            dash.wait(timeout=15)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
