"""One hint for a mistyped `--db`, the same in every command that reads or removes data.

`status --db harle` named the right database while `migrate status --db harle` and the
dashboard told the user to run `migrate up` on the mistyped one. Now `status`, `migrate
status`, `prune` and `dashboard` all say "no harel-beanie data in 'harle'; did you mean
'harel'?" (`harel_beanie.deploy.where.mistyped_db`); the last three refuse in that one line.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator

import pytest

from harel_beanie.deploy.embedded import free_port
from tests.commands.test_cli import one_line_error, run_cli


@pytest.fixture
def names(client) -> Iterator[tuple[str, str]]:
    """A database holding harel-beanie data, and its name with one letter dropped."""
    right = "hbt_typo_" + uuid.uuid4().hex[:10]
    client[right].harel_executions.insert_one({"_id": "e-1", "status": "DONE"})
    yield right, right[:-1]
    client.drop_database(right)


def _hint(names: tuple[str, str]) -> str:
    right, typo = names
    return f"no harel-beanie data in {typo!r}; did you mean {right!r}? (--db {right})"


def test_status_names_the_right_database(tmp_path: Path, mongo_url: str, names) -> None:
    proc = run_cli("status", "--url", mongo_url, "--db", names[1], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _hint(names) in " ".join(proc.stdout.split()), proc.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["migrate", "status"],
        ["prune", "--finished-before", "30d", "--dry-run"],
        ["prune", "--finished-before", "30d", "--yes"],
        ["dashboard"],
    ],
    ids=lambda a: " ".join(a),
)
def test_the_other_commands_refuse_with_the_same_hint(tmp_path: Path, mongo_url: str, names, args) -> None:
    port = ["--port", str(free_port())] if args[0] == "dashboard" else []
    proc = run_cli(*args, "--url", mongo_url, "--db", names[1], *port, cwd=tmp_path, timeout=60)
    line = one_line_error(proc)
    assert _hint(names) in line, line
    assert "migrate up" not in line and "token=" not in proc.stdout


def test_the_right_database_gets_no_hint(mongo_url: str, names) -> None:
    import asyncio

    from pymongo import AsyncMongoClient

    from harel_beanie.deploy.where import mistyped_db

    async def ask(db: str) -> object:
        client: AsyncMongoClient = AsyncMongoClient(mongo_url)
        try:
            return await mistyped_db(client, db, "harel")
        finally:
            await client.close()

    assert asyncio.run(ask(names[0])) is None
    assert asyncio.run(ask(names[1])) == _hint(names)
