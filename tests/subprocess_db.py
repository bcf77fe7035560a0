"""A database that child processes share with a test: real processes, real database."""

from __future__ import annotations

import atexit
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from contextlib import closing
from pathlib import Path

from django.db import connection

from tests.helpers import IMPORT_TIMESTAMPS, PROJECT


def database_url_for_children(tmp_path: Path) -> str:
    """pytest's PostgreSQL test database, or a migrated SQLite file under ``tmp_path``."""
    if connection.vendor == "postgresql":
        return this_database_url()
    return migrated_sqlite_url(tmp_path / "shared.sqlite3")


_migrated: list[Path] = []


def migrated_sqlite_url(path: Path) -> str:
    """A new SQLite database at ``path`` as ``manage.py migrate`` makes one: a copy of the one it
    made once for this test process (a migrate is seconds long, a copy a few milliseconds)."""
    if not _migrated:
        folder = Path(tempfile.mkdtemp(prefix="callproof-migrated-"))
        atexit.register(shutil.rmtree, folder, True)
        manage(f"sqlite:///{folder / 'migrated.sqlite3'}", "migrate", "-v", "0", check=True)
        _migrated.append(folder / "migrated.sqlite3")
    with closing(sqlite3.connect(_migrated[0])) as source, closing(sqlite3.connect(path)) as target:
        source.backup(target)
    return f"sqlite:///{path}"


def this_database_url() -> str:
    """The test's own database, for child processes that must see the rows this process writes
    (a transactional test commits them): pytest's PostgreSQL database, or the SQLite test file."""
    settings = connection.settings_dict
    if connection.vendor == "postgresql":
        return f"postgres://{settings['USER']}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}"
    return f"sqlite:///{settings['NAME']}"


# For imports compared with each other: a call is stale 15 minutes after it was prepared, by the
# importer's clock, and the session's demo runs pass that age while the suite runs. Two imports
# minutes apart would then differ by the stale findings alone (CI failed so at stop 63).
NEVER_STALE = ("--stale-minutes", "1000000")


def manage_command(*args: str) -> list[str]:
    return [sys.executable, str(PROJECT / "manage.py"), *args]


def child_env(url: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": url, "DJANGO_DEBUG": "1"}


def manage(url: str, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(
        manage_command(*args), env=child_env(url), capture_output=True, text=True, check=False, cwd=PROJECT
    )
    if check and completed.returncode != 0:
        raise AssertionError(f"manage.py {' '.join(args)} failed: {completed.stderr}")
    return completed


DUMP_SCRIPT = f"""
import hashlib, json
from evidence.models import Call, Confirmation, Event, EventTally, Finding, Host, Run, Submission
skip = {{"id", "run_id", *{IMPORT_TIMESTAMPS!r}}}
run_ids = dict(Run.objects.values_list("id", "run_id"))
# A host by its name: its primary key depends on the database's sequence, not on what was imported.
host_names = dict(Host.objects.values_list("id", "name"))
def natural(row, names):
    values = [host_names.get(value) if name == "host_id" else value for name, value in zip(names, row[1:])]
    return json.dumps([run_ids.get(row[0]), *values], sort_keys=True, default=str)
for model in (Run, Call, Submission, Event, EventTally, Finding, Confirmation):
    names = [f.attname for f in model._meta.concrete_fields if f.attname not in skip]
    keys = ["run_id"] if model is not Run else ["id"]
    rows = sorted(natural(row, names) for row in model.objects.values_list(*keys, *names).iterator())
    digest = hashlib.sha256("\\n".join(rows).encode()).hexdigest()
    print(model.__name__, len(rows), len(set(rows)), digest)
"""


def normalized_dump(url: str) -> list[str]:
    """Per table: row count, distinct row count and a digest of every row by natural key,
    without primary keys or the import's own timestamps."""
    return [line for line in manage(url, "shell", "-v", "0", "-c", DUMP_SCRIPT, check=True).stdout.splitlines() if line]


def start_worker(url: str, log: Path, *args: str, **env: str) -> subprocess.Popen[bytes]:
    """``manage.py db_worker`` as deploy/ runs it (without the development reloader), polling the
    queue often; its output goes to ``log``."""
    with log.open("ab") as output:
        return subprocess.Popen(
            manage_command("db_worker", "--no-reload", "--no-startup-delay", "--interval", "0.1", *args),
            env=child_env(url) | env, cwd=PROJECT, stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
