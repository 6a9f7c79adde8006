"""The `harel-beanie` command line: refusals (one line, exit 2), `status` on a backlog the
test really creates, `monitor` driven through Textual's pilot, `migrate` parsed like the others.

Commands run as a user runs them: `python -m harel_beanie ...` in a child process, pointed
at the session's server with `--url`. The helpers here are shared by the other CLI tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pymongo
import pytest
from harel.engine.execution import Execution, Status
from harel.engine.store.base import TimerOp
from harel.spec.states import Event

from harel_beanie.commands import cli
from harel_beanie.deploy.embedded import free_port
from harel_beanie.deploy.loader import default_models_dir
from harel_beanie.deploy.where import CLI_RETRY, Target

MODELS = default_models_dir()  # the shop models, shipped in the package

# what a command could otherwise pick up from the developer's environment
_SCRUB = (
    "MONGODB_URL",
    "HAREL_MONGO_URL",
    "HAREL_MONGO_DB",
    "HAREL_PREFIX",
    "HAREL_DEFINITIONS_DIR",
    "HAREL_CONCURRENCY",
    "HAREL_WORKER_ID",
    "HAREL_BEANIE_DATA",
    "HAREL_BEANIE_DEBUG",
)


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env.update(extra)
    return env


def run_cli(
    *args: str, cwd: Path, timeout: float = 120, env: Optional[dict[str, str]] = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harel_beanie", *args],
        cwd=cwd,
        env=env if env is not None else cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a refused command (asserting exit 2, one line, no traceback)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


# --- refusals -----------------------------------------------------------------------------


def test_the_console_script_refuses_in_one_line(tmp_path, mongo_url):
    """Through the real entry point: a wrong flag, an unreachable server (password masked),
    a missing definitions directory."""
    dead = f"mongodb://user:s3cret@127.0.0.1:{free_port()}"
    cases = [
        (["demo", "--bogus"], "harel-beanie demo: unrecognized arguments: --bogus"),
        (
            ["status", "--url", dead, "--connect-attempts", "2", "--connect-timeout", "0.3"],
            f"harel-beanie status: MongoDB at mongodb://user:***@127.0.0.1:{dead.rsplit(':', 1)[1]} did not answer a ping after 2 attempts",
        ),
        (
            ["worker", "--url", mongo_url, "--definitions", str(tmp_path / "nope")],
            f"harel-beanie worker: no definitions directory at {tmp_path / 'nope'}",
        ),
    ]
    for args, expected in cases:
        line = one_line_error(run_cli(*args, cwd=tmp_path, timeout=60))
        assert line.startswith(expected), (args, line)
        assert "s3cret" not in line


_REFUSALS = [
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["demo", "-n", "lots"], "expected a whole number"),
    (["demo", "--workers", "0"], "must be from 1 to"),
    (["status", "--stuck-after", "-5"], "must be more than 0"),
    (["status", "--stuck-after", "nan"], "must be a finite number"),
    (["status", "--stuck-after", "inf"], "must be a finite number"),
    (["status", "--stuck-after", "1e309"], "must be a finite number"),
    (["status", "--show", "true"], "expected a whole number"),
    (["prune", "--url", "{url}", "--finished-before", "@nan"], "--finished-before must be a finite number"),
    (
        ["prune", "--url", "{url}", "--finished-before", "99999999999999999999999999999999d"],
        "--finished-before must be",
    ),
    (["prune", "--url", "{url}", "--finished-before", "30x"], "--finished-before '30x': expected an age"),
    (["prune", "--url", "{url}", "--ttl", "5q"], "--ttl AGE is retired"),
    (["worker", "--url", "{url}", "--definitions", "{models}", "--retain", "5q"], "--retain is not an age: '5q'"),
    (["migrate", "up", "--url", "{url}", "--batch-size", "0"], "must be from 1 to"),
    (
        [
            "worker",
            "--url",
            "{dead}",
            "--definitions",
            "{models}",
            "--connect-attempts",
            "1",
            "--connect-timeout",
            "0.2",
        ],
        "did not answer a ping after 1 attempt over ",
    ),
    (["status", "--url", "not-a-url"], "not-a-url (from --url) is not a MongoDB URL"),
    (["status", "--url", "mongodb://h:notaport"], "cannot use mongodb://h:notaport"),
    (["status", "--url", "{url}", "--db", "bad.name"], "is not a MongoDB database name"),
    (["status", "--url", "{url}", "--prefix", "9-bad"], "prefix '9-bad' is refused"),
    (["worker", "--url", "{url}"], "no definitions: pass --definitions DIR or set HAREL_DEFINITIONS_DIR"),
    (["worker", "--definitions", "{models}"], "no MongoDB URL: pass --url"),
    (["worker", "--url", "{url}", "--definitions", "{tmp}"], "no machines in"),
    (["monitor", "--url", "{url}", "--definitions", "{tmp}/nope"], "no definitions directory at"),
    (["monitor", "--url", "{dead}", "--connect-attempts", "1", "--connect-timeout", "0.2"], "did not answer"),
    (["demo", "--url", "{url}", "--models", "{tmp}/nope"], "--models: no models directory at"),
    (["demo", "--url", "{url}", "--models", "{tmp}"], "--models: no *.stm models in"),
]


@pytest.mark.parametrize(
    "args,expected", _REFUSALS, ids=[" ".join(a[:2]) + f"-{i}" for i, (a, _) in enumerate(_REFUSALS)]
)
def test_each_refusal_is_one_line_and_exit_2(args, expected, tmp_path, mongo_url, monkeypatch, capsys):
    for var in _SCRUB:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    values = {
        "url": mongo_url,
        "dead": f"mongodb://127.0.0.1:{free_port()}",
        "models": str(MODELS),
        "tmp": str(tmp_path),
    }
    assert cli.main([a.format(**values) for a in args]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and expected in err[0] and err[0].startswith("harel-beanie"), err


_EARLY = [
    (["demo", "--models", "typo"], "--models: no models directory at typo"),
    (["prune"], "say what to remove: --finished-before"),
    (["prune", "--finished-before", "30x"], "--finished-before '30x'"),
    (["prune", "--ttl", "30d"], "retain with `harel-beanie worker --retain AGE`"),
    (["prune", "--finished-before", "1d", "--archive", "a.jsonl", "--archive-collection", "c"], "choose one"),
    (["dashboard", "--allow", "send"], "--allow needs --definitions DIR"),
    (["dashboard", "--allow", "fly", "--definitions", "{models}"], "--allow: unknown action(s) fly"),
    (["dashboard", "--definitions", "typo"], "--definitions: no definitions directory at typo"),
    (["monitor", "--definitions", "typo"], "--definitions: no definitions directory at typo"),
]


@pytest.mark.parametrize("args,expected", _EARLY, ids=[" ".join(a[:2]) for a, _ in _EARLY])
def test_a_wrong_flag_is_refused_before_the_embedded_server_starts(args, expected, tmp_path, monkeypatch, capsys):
    """No URL: the embedded server would start on ./harel-beanie-data; a flag the command
    refuses is refused first, naming the flag, and no data folder is made (`demo --models
    typo` used to start the server and spend 16 s before saying so)."""
    for var in _SCRUB:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    assert cli.main([a.format(models=MODELS) for a in args]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "harel-beanie-data").exists()


def test_the_worker_refuses_a_missing_definitions_folder_before_it_resolves_a_server(tmp_path, monkeypatch, capsys):
    """The worker's flag checks hold the definitions folder: a typo is refused before the
    server is resolved (started, adopted or pinged), not by the load after it."""
    from harel_beanie.deploy import where

    for var in _SCRUB:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    resolved: list[Any] = []
    real = where.resolve

    def resolve(**options: Any) -> Any:
        resolved.append(options["url"])
        return real(**options)

    monkeypatch.setattr(where, "resolve", resolve)
    dead = f"mongodb://127.0.0.1:{free_port()}"
    assert cli.main(["worker", "--url", dead, "--definitions", str(tmp_path / "nope")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [f"harel-beanie worker: no definitions directory at {tmp_path / 'nope'}"], err
    assert not resolved, f"the server was resolved before the folder was checked: {resolved}"


def test_the_monitor_without_its_extra_is_refused_before_the_embedded_server_starts(tmp_path, monkeypatch, capsys):
    for var in _SCRUB:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "harel.tui.app", None)  # what a missing extra looks like to import
    assert cli.main(["monitor"]) == 2
    err = capsys.readouterr().err.strip()
    assert "pip install 'harel-beanie[tui]'" in err, err
    assert not (tmp_path / "harel-beanie-data").exists()


def test_an_unreachable_server_is_reported_with_the_attempts_made_and_the_time_taken(tmp_path):
    """ "1 attempt" (not "1 attempts"), and the seconds the attempts took, pings' waits
    included (it used to say "over about 2s" after 8.4 s)."""
    import re

    dead = f"mongodb://127.0.0.1:{free_port()}"
    for attempts, said in ((1, "1 attempt"), (2, "2 attempts")):
        line = one_line_error(
            run_cli(
                "status",
                "--url",
                dead,
                "--connect-attempts",
                str(attempts),
                "--connect-timeout",
                "0.3",
                cwd=tmp_path,
            )
        )
        m = re.search(rf"did not answer a ping after {said} over (\d+\.\d)s: ", line)
        assert m, line


def test_version_names_the_package_and_harel(tmp_path):
    from importlib.metadata import version

    proc = run_cli("--version", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"harel-beanie {version('harel-beanie')} (harel {version('harel')})"


def test_a_malformed_harel_variable_is_one_line(tmp_path, mongo_url, monkeypatch, capsys):
    monkeypatch.setenv("HAREL_CONCURRENCY", "many")
    assert cli.main(["worker", "--url", mongo_url, "--definitions", str(MODELS)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a number" in err[0]


def test_help_lists_every_command(tmp_path):
    proc = run_cli("--help", cwd=tmp_path)
    assert proc.returncode == 0
    for command in ("demo", "worker", "status", "monitor", "migrate"):
        assert command in proc.stdout
    for command in ("demo", "worker", "status", "monitor"):
        sub = run_cli(command, "--help", cwd=tmp_path)
        assert sub.returncode == 0 and "--url" in sub.stdout, sub.stderr


def test_migrate_is_parsed_like_every_command(monkeypatch):
    """`migrate` is one more command of the same parser, resolving --url/--db/--prefix by
    the same rules, and run by its own module."""
    from harel_beanie.commands import migrate as command

    for var in _SCRUB:
        monkeypatch.delenv(var, raising=False)
    seen: list[tuple[str, str, str, str]] = []
    monkeypatch.setattr(command, "main", lambda args, t: seen.append((args.action, t.url, t.db, t.prefix)) or 0)
    assert cli.main(["migrate", "up", "--url", "mongodb://x"]) == 0
    assert seen == [("up", "mongodb://x", "harel", "harel")]


def test_python_m_harel_beanie_migrate_is_the_migrate_command(tmp_path):
    """`python -m harel_beanie migrate` is `harel-beanie migrate`."""
    proc = subprocess.run(
        [sys.executable, "-m", "harel_beanie", "migrate", "--help"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "harel-beanie migrate" in proc.stdout and "{up,down,status}" in proc.stdout
    line = one_line_error(
        subprocess.run(
            [sys.executable, "-m", "harel_beanie", "migrate", "up"],
            cwd=tmp_path,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    )
    assert line.startswith("harel-beanie migrate: no MongoDB URL"), line


# --- status -------------------------------------------------------------------------------


async def seed_backlog(astore: Any, now: float) -> None:
    """A backlog that is really there: a pending outbox entry, a pending spawn, a due timer
    and a timer ahead, a RUNNING execution silent for an hour, and some finished ones."""

    def exe(i: str, definition: str, status: Status, updated: float) -> Execution:
        return Execution(id=i, definition_id=definition, status=status, updated_at=updated)

    await astore.save(exe("silent", "Order", Status.RUNNING, now - 3600))
    for i in range(3):
        await astore.save(exe(f"done-{i}", "Order", Status.DONE, now - 60))
    await astore.save(exe("failed", "Payment", Status.FAILED, now - 60))
    await astore.commit(
        exe("emitter", "Order", Status.RUNNING, now - 5),
        [("silent", Event(kind="Ping"))],
        timers=(TimerOp("schedule", "CoolingOff", now + 600),),
    )
    await astore.commit(
        exe("forker", "Order", Status.RUNNING, now - 5),
        [],
        timers=(TimerOp("schedule", "Charging", now - 30),),
        spawns=(("forker:Fulfilment.Warehouse:0", "Fulfilment.Warehouse", {}),),
    )


async def test_status_reports_the_backlog_that_is_there(astore, mongo_url, db_name, tmp_path):
    now = time.time()
    await seed_backlog(astore, now)
    where = ["--url", mongo_url, "--db", db_name]

    proc = run_cli("status", *where, "--json", "--stuck-after", "600", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["counts"] == {"Order": {"RUNNING": 3, "DONE": 3}, "Payment": {"FAILED": 1}}
    assert data["totals"] == {"RUNNING": 3, "DONE": 3, "FAILED": 1} and data["executions"] == 7
    assert data["pending_outbox"] == 1 and data["pending_spawns"] == 1
    assert data["oldest_outbox_age"] is not None and 0 <= data["oldest_outbox_age"] < 120
    assert data["due_timers"] == 1
    assert [(t["id"], t["path"]) for t in data["next_timers"]] == [("forker", "Charging"), ("emitter", "CoolingOff")]
    assert [s["id"] for s in data["stuck"]] == ["silent"] and data["stuck"][0]["silent_for"] >= 3600
    assert data["stuck_after"] == 600
    assert data["transport"] == {"queued": 0, "leased": 0}
    assert data["where"] == {"url": mongo_url, "db": db_name, "prefix": "harel"}

    # a longer threshold: nothing is stuck
    relaxed = json.loads(run_cli("status", *where, "--json", "--stuck-after", "7200", cwd=tmp_path).stdout)
    assert relaxed["stuck"] == []

    table = run_cli("status", *where, "--stuck-after", "600", cwd=tmp_path, env=cli_env(COLUMNS="120"))
    assert table.returncode == 0, table.stderr
    out = table.stdout
    for text in (
        "Executions",
        "Order",
        "Payment",
        "Pending work",
        "outbox entries",
        "oldest",
        "Next timers",
        "Charging",
        "due",
        "Stuck",
        "silent",
        "60m",
    ):
        assert text in out, (text, out)
    # the word the counts use (status) told apart from the model's verdict (outcome)
    assert "an order whose card was declined is DONE, outcome failed" in " ".join(out.split())


def test_status_on_an_empty_database_says_so(mongo_url, db_name, tmp_path):
    proc = run_cli("status", "--url", mongo_url, "--db", db_name, "--prefix", "nobodyuses", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"No executions in database {db_name}, collection nobodyuses_executions" in proc.stdout
    assert "harel-beanie demo" in proc.stdout or "elsewhere" in proc.stdout
    assert "Nothing stuck" in proc.stdout


# --- monitor ------------------------------------------------------------------------------


async def test_monitor_starts_and_lists_the_executions(astore, mongo_url, db_name):
    from textual.widgets import DataTable

    from harel_beanie.commands.monitor import build_app

    ids = ["order-a", "order-b", "payment-c"]
    for i in ids:
        await astore.save(
            Execution(
                id=i,
                definition_id="Order" if i.startswith("order") else "Payment",
                status=Status.RUNNING,
                updated_at=time.time(),
            )
        )
    app = build_app(Target(mongo_url, db_name, "harel", CLI_RETRY, "--url"), str(MODELS), interval=0.25)
    try:
        async with app.run_test(size=(140, 40)) as pilot:
            table = app.screen.query_one("#executions", DataTable)
            for _ in range(150):  # the list loads on a worker thread
                await pilot.pause(0.1)
                if table.row_count >= len(ids):
                    break
            assert sorted(str(k.value) for k in table.rows) == ids
            assert "3 executions" in app.screen.sub_title
            await pilot.press("enter")  # the detail screen of the first row opens
            for _ in range(50):
                await pilot.pause(0.1)
                if type(app.screen).__name__ == "DetailScreen":
                    break
            assert type(app.screen).__name__ == "DetailScreen"
            await pilot.press("escape")
            await pilot.press("q")
    finally:
        app.model.close()


def test_monitor_refuses_a_missing_url_server_quickly(tmp_path):
    dead = f"mongodb://127.0.0.1:{free_port()}"
    line = one_line_error(
        run_cli("monitor", "--url", dead, "--connect-attempts", "1", "--connect-timeout", "0.3", cwd=tmp_path)
    )
    assert "did not answer" in line


@pytest.mark.parametrize("command", ["status", "monitor"])
def test_commands_without_a_url_use_the_embedded_data_folder(tmp_path, command):
    """No URL anywhere: `status` starts the embedded server on ./harel-beanie-data (and says
    so on stderr, so --json stays parseable); `monitor` refuses a bad flag before starting it."""
    if command == "status":
        (tmp_path / "harel-beanie-data").mkdir()  # a folder a demo or a server made
        proc = run_cli("status", "--json", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["executions"] == 0
        assert "started the embedded MongoDB server" in proc.stderr
        assert (tmp_path / "harel-beanie-data" / "db").is_dir()
        assert not (tmp_path / "harel-beanie-data" / "server.json").exists()  # stopped, handed back
    else:
        line = one_line_error(run_cli("monitor", "--interval", "0", cwd=tmp_path))
        assert "must be more than 0" in line
        assert not (tmp_path / "harel-beanie-data").exists()


@pytest.mark.parametrize(
    "args", [["status"], ["prune", "--finished-before", "7d", "--yes"], ["dashboard"], ["status", "--data", "typo"]]
)
def test_a_reading_command_in_an_empty_folder_says_what_to_run_and_makes_no_folder(tmp_path, args):
    """No URL and no data folder: nothing to read. The command says so and names the
    commands that make data or name a server, instead of starting the embedded server on a
    new empty folder (`status` used to make ./harel-beanie-data and print only "No executions")."""
    line = one_line_error(run_cli(*args, cwd=tmp_path, timeout=60))
    folder = args[-1] if "--data" in args else "harel-beanie-data"
    assert f"no data folder {folder}/ here" in line, line
    assert "harel-beanie demo" in line and "harel-beanie server" in line and "--url" in line
    assert ("check --data" in line) == ("--data" in args)
    assert not (tmp_path / folder).exists()


async def test_status_on_a_mistyped_database_names_where_the_executions_are(astore, mongo_url, db_name, tmp_path):
    await astore.save(Execution(id="kept-1", definition_id="Order", status=Status.RUNNING, updated_at=time.time()))
    typo = db_name + "x"
    proc = run_cli("status", "--url", mongo_url, "--db", typo, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"No executions in database {typo}, collection harel_executions." in proc.stdout
    assert f"harel-beanie status --db {db_name} --prefix harel" in proc.stdout.split("elsewhere:")[1].splitlines()[1]
    data = json.loads(run_cli("status", "--json", "--url", mongo_url, "--db", typo, cwd=tmp_path).stdout)
    assert data["elsewhere"][0] == {"db": db_name, "prefix": "harel", "executions": 1}
    with pymongo.MongoClient(mongo_url) as client:  # status only read: the typo made no database
        assert typo not in client.list_database_names()


def test_the_embedded_server_is_joined_taken_over_or_refused_to_a_second_demo(tmp_path):
    """The data folder's `server.json` says which command runs its server: a live owner's
    server is joined (and left running), a dead owner's is taken over (and stopped), and a
    demo does not share a running demo's server."""
    from harel_beanie.deploy.embedded import EmbeddedServer

    data = tmp_path / "harel-beanie-data"
    server = EmbeddedServer(data / "db", log_path=tmp_path / "server.log").start()
    try:
        assert server.proc is not None
        record = {"port": server.port, "pid": server.proc.pid, "command": "demo"}

        (data / "server.json").write_text(json.dumps({**record, "owner": os.getpid()}))  # a live demo
        joined = run_cli("status", "--json", cwd=tmp_path)
        assert joined.returncode == 0, joined.stderr
        assert "using the embedded server another harel-beanie command runs" in joined.stderr
        assert json.loads(joined.stdout)["where"]["url"] == server.url
        assert server.proc.poll() is None and (data / "server.json").exists()  # left to its owner
        line = one_line_error(run_cli("demo", "-n", "5", cwd=tmp_path))
        assert "another demo" in line and "--data DIR" in line

        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        (data / "server.json").write_text(json.dumps({**record, "owner": int(dead.stdout)}))  # killed
        adopted = run_cli("status", "--json", cwd=tmp_path)
        assert adopted.returncode == 0, adopted.stderr
        assert "taking over the embedded server left running" in adopted.stderr
        assert "Stopping the embedded server" in adopted.stderr
        server.proc.wait(timeout=30)  # it stopped the server it took over
        assert not (data / "server.json").exists()
    finally:
        server.stop(kill=True)


def test_the_embedded_server_a_command_starts_keeps_one_allocator_pool(tmp_path, monkeypatch):
    """Its memory is bounded to about one whole-collection read (`BOUNDED_MEMORY`): with a
    pool per connection it held 9.4 GB at 300,000 executions."""
    from harel_beanie.deploy.local_server import LocalServer

    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    local = LocalServer(tmp_path / "data")
    local.open()
    try:
        assert local._server is not None and local._server.proc is not None
        environ = Path(f"/proc/{local._server.proc.pid}/environ").read_bytes().split(b"\0")
        assert b"MALLOC_ARENA_MAX=1" in environ
    finally:
        local.close()


async def test_status_says_its_counts_are_partial_while_counters_are_unbuilt(
    astore, client, mongo_url, db_name, tmp_path
):
    """A database whose counters are not all built (an upgrade; core.counting's last
    paragraph): `status` counts the built partitions only, names the others in `unbuilt`,
    and says so above its table, instead of building them."""
    now = time.time()
    await seed_backlog(astore, now)
    db = client[db_name]
    db["harel_executions"].update_many({}, {"$unset": {"cdirty": "", "cc": "", "cseq": ""}})
    db["harel_hb_counts"].delete_many({"_id": {"$ne": 0}})  # partition 0 stays built
    where = ["--url", mongo_url, "--db", db_name]
    data = json.loads(run_cli("status", *where, "--json", cwd=tmp_path).stdout)
    assert data["unbuilt"] == list(range(1, 16))
    assert db["harel_hb_counts"].count_documents({}) == 1  # nothing built by the command
    table = run_cli("status", *where, cwd=tmp_path, env=cli_env(COLUMNS="200")).stdout
    assert "Counts partial: 15 partition(s) not counted yet" in " ".join(table.split()), table
    assert "No executions" not in table
