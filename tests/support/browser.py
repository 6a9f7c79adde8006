"""Helpers for the browser tests: Debian's chromium driven by selenium, and the standalone
dashboard started as the `harel-beanie dashboard` command.

Chromium is never downloaded: `make browser` installs Debian's `chromium` and
`chromium-driver`, and the tests point selenium at them. Without them the browser tests
are skipped with the reason (they run in `make test`, which installs them).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator, Optional

CHROMIUM = os.environ.get("HAREL_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("HAREL_CHROMEDRIVER", "/usr/bin/chromedriver")
# no sync, updates or background fetches: this machine's network is closed, and a test
# browser should not talk to anyone but the page under test
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--window-size=1400,1000",
)


def browser_missing() -> Optional[str]:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            return f"{path} is not installed (make browser installs Debian's chromium and chromium-driver)"
    return None


def chrome(profile: Path) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    # the console's messages, for `driver.get_log("browser")`: a policy violation shows there
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Dashboard:
    """`harel-beanie dashboard` as a child process on a free port."""

    def __init__(self, mongo_url: str, db: str, token: str, *extra: str) -> None:
        self.port = free_port()
        self.token = token
        self.base = f"http://127.0.0.1:{self.port}"
        from tests.commands.test_cli import cli_env

        cmd = [
            sys.executable,
            "-m",
            "harel_beanie",
            "dashboard",
            "--url",
            mongo_url,
            "--db",
            db,
            "--port",
            str(self.port),
            "--token",
            token,
            *extra,
        ]
        self.log = tempfile.NamedTemporaryFile(prefix="dashboard-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=cli_env())

    def wait(self, timeout: float = 60.0) -> "Dashboard":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the dashboard exited: {Path(self.log.name).read_text()}")
            try:
                self.get("/api/backlog", token=self.token)
                return self
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.2)
        raise TimeoutError(Path(self.log.name).read_text())

    def get(self, path: str, token: Optional[str] = None) -> tuple[int, bytes]:
        req = urllib.request.Request(self.base + path)
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


def profile_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="chromium-profile-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def browser_session() -> Iterator[Any]:
    """A Chromium driver on a fresh profile, quit and its profile removed afterwards: the body
    of each browser test module's `browser` fixture."""
    for profile in profile_dir():
        driver = chrome(profile)
        driver.set_page_load_timeout(60)
        try:
            yield driver
        finally:
            driver.quit()
