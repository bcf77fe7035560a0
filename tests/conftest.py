"""Shared fixtures: run directories made by the real writer, the demo imported, a logged-in client."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from django.utils import translation

from receipts import runtime
from receipts.demo import write_demo_runs
from tests.helpers import CONTRACT, data_path, join
from tests.imported_demo import ImportedDemo
from tests.served import shared_tmp, users  # noqa: F401 - fixtures for the writer daemon's tests
from tests.shipping import mirror, shipping_host  # noqa: F401 - the shipper's tests' fixtures

# Where each test runs (once, or on both databases) and the record each pass writes.
pytest_plugins = ["tests.suite_plugin"]


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test database; on PostgreSQL it commits without waiting for the server's
    log to reach the disk (``synchronous_commit = off``, for this database alone, every session
    of it, children's included). Only a crash of the server itself could lose a commit, and no
    test crashes the server: the writer's durability is on files, not here. Its flush deletes
    rather than truncates (``deleting_flush``)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        yield
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{connection.settings_dict["NAME"]}" SET synchronous_commit = off')
        cursor.execute("SET synchronous_commit = off")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(connection.ops), "sql_flush", deleting_flush(type(connection.ops).sql_flush))
        yield


def deleting_flush(truncating_flush):
    """PostgreSQL's flush with ``DELETE`` in place of one ``TRUNCATE`` of every table.

    A transactional test (the live server's, the browser's, every one whose children write)
    ends with a flush. ``TRUNCATE`` makes new files for each of the 32 tables and their indexes:
    0.35 to 1 s a test, against 6 ms to delete the few rows a test leaves. The tables end as
    empty either way: Django's foreign keys on PostgreSQL are checked at the commit, so the order
    of the deletes does not matter. Sequences are not restarted by either, unless asked for."""

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or allow_cascade:
            return truncating_flush(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        return [f"DELETE FROM {self.quote_name(table)};" for table in tables]

    return sql_flush


@pytest.fixture
def vectors() -> dict:
    return json.loads(data_path("vectors.json").read_bytes())


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run-1"
    runtime.run_init(path, contract_sha256=CONTRACT)
    return path


@pytest.fixture(scope="session")
def demo_source(tmp_path_factory) -> Path:
    """The demo runs, written once per session by the real writer. Never change them: copy."""
    root = tmp_path_factory.mktemp("demo-source")
    write_demo_runs(root)
    return root


@pytest.fixture
def demo_root(demo_source, tmp_path) -> Path:
    """A private copy of the demo runs that a test may change (copying keeps the writer's bytes)."""
    return Path(shutil.copytree(demo_source, tmp_path / "runs", symlinks=True))


@pytest.fixture(scope="session")
def imported_demo(demo_source, tmp_path_factory) -> ImportedDemo:
    return ImportedDemo(demo_source, tmp_path_factory.mktemp("demo-imported"))


@pytest.fixture
def demo(imported_demo, db) -> Path:
    """The demo runs, imported as a person would see them 20 minutes later (the killed calls are stale).

    Their folder is this test process's copy (``tests/imported_demo.py``): a test may change it,
    and the next one that asks gets a new copy, imported again."""
    return imported_demo.for_this_test()


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    """A new writer's key outside every run directory, as a deployment keeps it."""
    path = tmp_path / "keys" / "callproof.key"
    path.parent.mkdir()
    path.write_bytes(os.urandom(32).hex().encode())
    return path


@pytest.fixture
def user(django_user_model):
    return join(django_user_model.objects.create_user("alice", password="a-long-password-1"), "viewer")


@pytest.fixture
def chinese(client, django_user_model):
    """Someone who sees every page and form, reading in Chinese (their browser asks for it)."""
    ada = django_user_model.objects.create_user("ada", password="a-long-password-1")
    client.force_login(join(ada, "admin", "confirmer", "exporter"))
    client.defaults["HTTP_ACCEPT_LANGUAGE"] = "zh-CN,zh;q=0.9,en;q=0.5"
    return client


@pytest.fixture
def logged_in(client, user):
    """Django's test client, logged in as ``user``."""
    client.force_login(user)
    return client


@pytest.fixture(autouse=True)
def export_root(tmp_path, settings) -> Path:
    """Each test's evidence exports in its own folder, never under the checkout's var/."""
    settings.EVIDENCE_EXPORT_ROOT = tmp_path / "exports"
    return settings.EVIDENCE_EXPORT_ROOT


@pytest.fixture(autouse=True)
def site_language():
    """Each test starts in the site's language. A request leaves its reader's language active in
    the thread (LocaleMiddleware activates it and nothing deactivates it), so a test that asked
    in Chinese made the next test in that process read Chinese: which test that was depended on
    how the suite was shared between workers."""
    translation.deactivate()
    yield
    translation.deactivate()


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs (for archives, for exports): a full disk, for real."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=False).returncode:
        pytest.fail("mounting a tmpfs needs root: the suite runs as root here and in CI")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)
