"""The standalone dashboard's door: what a browser without the token is told, and the token
kept in the data folder across restarts.

A browser opening the dashboard without its token used to get `{"detail": ...}` as raw JSON,
and every start of `harel-beanie dashboard` drew a new token, so the link printed at the last
start (and the browser's cookie) stopped working at each restart.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harel_beanie.dashboard.serve import build_app
from harel_beanie.dashboard.tokens import TOKEN_FILE, kept_token
from tests.commands.test_cli import cli_env
from tests.dashboard.test_dashboard_serve import MODELS, TOKEN, served, target
from tests.support.browser import free_port

BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


async def test_a_browser_without_the_token_is_told_how_to_get_in(mongo_url: str, db_name: str) -> None:
    app = build_app(target(mongo_url, db_name), token=TOKEN, definitions_dir=MODELS, say=lambda _: None)
    async with served(app) as http:
        for path in ("/", "/execution?id=x", "/api/executions", "/openapi.json"):
            r = await http.get(path, headers=BROWSER)
            assert r.status_code == 401 and r.headers["content-type"].startswith("text/html"), (path, r.text)
            assert "harel-beanie dashboard" in r.text and "?token=" in r.text, path
            assert (
                r.headers["www-authenticate"] == "Bearer"
                and "default-src 'none'" in r.headers["content-security-policy"]
            )
            # a script asking for JSON, or for nothing in particular, keeps the JSON
            for headers in ({"Accept": "application/json"}, {}):
                r = await http.get(path, headers=headers)
                assert r.status_code == 401 and r.json() == {"detail": "a valid dashboard token is required"}, path
        # with the token, the page itself
        r = await http.get("/", headers={**BROWSER, "Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and "<form" in r.text


def test_the_token_is_kept_owner_only_and_rotated_on_demand(tmp_path: Path) -> None:
    first = kept_token(tmp_path)
    path = tmp_path / TOKEN_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().strip() == first
    assert kept_token(tmp_path) == first
    path.chmod(0o644)  # copied with a wider mode: taken, and made the owner's only again
    assert kept_token(tmp_path) == first and stat.S_IMODE(path.stat().st_mode) == 0o600
    rotated = kept_token(tmp_path, rotate=True)
    assert rotated != first and kept_token(tmp_path) == rotated
    path.write_text("not one of ours\n")  # not a token this module draws: replaced
    assert kept_token(tmp_path) not in ("not one of ours", rotated)
    assert kept_token(None) != kept_token(None)  # no data folder: drawn at each start, not kept


class Started:
    """`harel-beanie dashboard` on the embedded server of `folder`, until stopped by Ctrl-C."""

    def __init__(self, folder: Path, *extra: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harel_beanie", "dashboard", "--port", str(self.port), *extra],
            cwd=folder,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.out = ""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.out += line
            found = re.search(r"\?token=(\S+)", line)
            if found:
                self.token = found.group(1)
                break
        else:
            raise AssertionError(f"no link printed: {self.out}")

    def status(self, token: str) -> int:
        """The status of the front page asked with `token`, once the server answers."""
        for _ in range(300):
            req = urllib.request.Request(f"http://127.0.0.1:{self.port}/api/backlog")
            req.add_header("Authorization", f"Bearer {token}")
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return int(r.status)
            except urllib.error.HTTPError as e:
                return e.code
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise AssertionError(f"the dashboard did not answer: {self.out}")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()


@pytest.mark.skipif(os.name != "posix", reason="file modes and Ctrl-C as on POSIX")
def test_a_restart_keeps_the_link_and_new_token_rotates_it(tmp_path: Path) -> None:
    (tmp_path / "harel-beanie-data").mkdir()
    one = Started(tmp_path)
    try:
        assert one.status(one.token) == 200
    finally:
        one.stop()
    kept = tmp_path / "harel-beanie-data" / TOKEN_FILE
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and kept.read_text().strip() == one.token
    two = Started(tmp_path)
    try:
        assert two.token == one.token and two.status(one.token) == 200
    finally:
        two.stop()
    three = Started(tmp_path, "--new-token")
    try:
        assert three.token != one.token and three.status(three.token) == 200 and three.status(one.token) == 401
    finally:
        three.stop()
    assert kept.read_text().strip() == three.token
