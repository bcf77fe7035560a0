"""The suite's split between the databases (tests/suite_plugin.py, tests/suite_split.py): a test that
uses the database runs on both and is caught when it did not; any other runs once, and a child it
starts cannot reach a database behind its back.

The passes are real pytest runs, in a child process, over a small test file made here, as
tests/suite.sh runs them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from tests.helpers import PROJECT
from tests.suite_split import missing

SAMPLE = """
import pytest
from django.db import connection


def test_pure():
    assert sum([1, 2]) == 3


@pytest.mark.django_db
def test_on_both():
    assert connection.vendor in ("sqlite", "postgresql")


def test_through_a_fixture(db):
    assert connection.vendor in ("sqlite", "postgresql")


@pytest.mark.django_db
def test_skips_itself_on_sqlite():
    if connection.vendor == "sqlite":
        pytest.skip("a skip of its own, that no marker says")


@pytest.mark.browser
@pytest.mark.django_db
def test_a_browser_test():
    assert connection.vendor in ("sqlite", "postgresql")


@pytest.mark.postgresql(reason="it asks PostgreSQL itself")
@pytest.mark.django_db
def test_postgresql_only():
    assert connection.vendor == "postgresql"
"""


def run_pass(tmp_path: Path, database_url: str | None, *args: str) -> dict:
    """One pass of pytest over the sample file, in a child, as tests/suite.sh runs it; its record."""
    sample = tmp_path / "test_sample.py"
    sample.write_text(SAMPLE)
    record = tmp_path / f"record-{len(list(tmp_path.glob('record-*')))}.json"
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    if database_url:
        env["DATABASE_URL"] = database_url
    # Its own test database, whatever this run's is called.
    env["CALLPROOF_TEST_DATABASE"] = f"test_callproof_split_{tmp_path.name[-12:].lower()}"
    # --nomigrations: the sample asks its connection nothing but its vendor, and the tables made
    # from the models without running every migration spare about two seconds a pass.
    pytest_in_a_child(tmp_path, env, "--nomigrations", "--suite-record", str(record), *args, str(sample))
    return json.loads(record.read_text())


def pytest_in_a_child(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """pytest with the project's settings and the suite's plugin, in order, rooted at ``tmp_path``."""
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(PROJECT / "pyproject.toml"), "--rootdir", str(tmp_path),
         "-p", "tests.suite_plugin", "-p", "no:randomly", "-q", *args],
        cwd=PROJECT, env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed


def outcomes(record: dict) -> dict[str, str]:
    return {nodeid.rsplit("::", 1)[1]: test["outcome"] for nodeid, test in record["tests"].items()}


def test_the_slow_tests_run_first_in_each_group_the_database_makes(tmp_path):
    """pytest-xdist hands tests out in the collected order: a long test at the end keeps one worker
    busy while the other waits. pytest-django's groups (the database, then none) stay as they are."""
    sample = tmp_path / "test_order.py"
    sample.write_text(
        "import pytest\n\n"
        "def test_quick_pure(): pass\n\n"
        "@pytest.mark.django_db\ndef test_quick_on_the_database(): pass\n\n"
        "@pytest.mark.slow\ndef test_slow_pure(): pass\n\n"
        "@pytest.mark.slow\n@pytest.mark.django_db\ndef test_slow_on_the_database(): pass\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    completed = pytest_in_a_child(tmp_path, env, "--collect-only", str(sample))
    collected = [line.rsplit("::", 1)[1] for line in completed.stdout.splitlines() if "::" in line]
    assert collected == ["test_slow_on_the_database", "test_quick_on_the_database", "test_slow_pure", "test_quick_pure"]


def test_the_second_pass_runs_the_tests_that_use_the_database_and_no_browser_test(tmp_path):
    record = run_pass(tmp_path, None, "--database-tests-only")
    assert record["database"] == "sqlite"
    assert outcomes(record) == {
        "test_on_both": "passed",
        "test_through_a_fixture": "passed",
        "test_skips_itself_on_sqlite": "skipped",
    }
    assert all(test["uses_database"] for test in record["tests"].values())


def test_one_pass_on_sqlite_runs_everything_and_says_why_a_postgresql_test_did_not(tmp_path):
    record = run_pass(tmp_path, None, "-rs")
    assert outcomes(record) == {
        "test_pure": "passed",
        "test_on_both": "passed",
        "test_through_a_fixture": "passed",
        "test_skips_itself_on_sqlite": "skipped",
        "test_a_browser_test": "passed",
        "test_postgresql_only": "skipped",
    }
    by_name = {nodeid.rsplit("::", 1)[1]: test for nodeid, test in record["tests"].items()}
    assert not by_name["test_pure"]["uses_database"] and by_name["test_through_a_fixture"]["uses_database"]
    assert by_name["test_a_browser_test"]["browser"] and by_name["test_postgresql_only"]["postgresql_only"]


@pytest.mark.postgresql
def test_the_check_after_both_passes_names_a_test_that_ran_on_one_database_only(tmp_path):
    database = settings.DATABASES["default"]
    postgresql_url = f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/postgres"
    on_postgresql = run_pass(tmp_path, postgresql_url)
    on_sqlite = run_pass(tmp_path, None, "--database-tests-only")
    assert outcomes(on_postgresql) == dict.fromkeys(
        ["test_pure", "test_on_both", "test_through_a_fixture", "test_skips_itself_on_sqlite",
         "test_a_browser_test", "test_postgresql_only"], "passed",
    )  # fmt: skip
    problems = missing(on_postgresql, on_sqlite)
    assert [problem.split("::")[-1] for problem in problems] == [
        "test_skips_itself_on_sqlite: uses the database, ran on PostgreSQL and was skipped on SQLite"
    ]

    # The command tests/suite.sh runs says the same, and exits 1.
    paths = [tmp_path / "postgresql.json", tmp_path / "sqlite.json"]
    for path, record in zip(paths, (on_postgresql, on_sqlite), strict=True):
        path.write_text(json.dumps(record))
    completed = subprocess.run(
        [sys.executable, "-m", "tests.suite_split", *map(str, paths)],
        cwd=PROJECT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert completed.returncode == 1
    assert "test_skips_itself_on_sqlite: uses the database, ran on PostgreSQL" in completed.stderr


def record_of(database: str, **tests: dict) -> dict:
    base = {"uses_database": True, "browser": False, "postgresql_only": False, "outcome": "passed"}
    return {"database": database, "tests": {name: base | test for name, test in tests.items()}}


def test_the_check_names_each_way_a_test_can_miss_a_database():
    postgresql = record_of(
        "postgresql",
        both={}, not_on_sqlite={}, browser={"browser": True}, pure={"uses_database": False},
        postgresql_only={"postgresql_only": True},
    )  # fmt: skip
    sqlite = record_of(
        "sqlite",
        both={}, browser={"browser": True}, postgresql_only={"postgresql_only": True}, not_on_postgresql={},
        pure={"uses_database": False},
    )  # fmt: skip
    assert missing(postgresql, sqlite) == [
        "browser: runs on PostgreSQL alone and ran on SQLite too",
        "not_on_postgresql: uses the database and did not run on PostgreSQL",
        "not_on_sqlite: uses the database and did not run on SQLite",
        "postgresql_only: runs on PostgreSQL alone and ran on SQLite too",
        "pure: uses no database and ran twice",
    ]
    assert missing(record_of("sqlite"), record_of("sqlite")) == [
        "the PostgreSQL record was written by a pass on 'sqlite'"
    ]


def test_a_child_of_a_test_that_did_not_ask_for_the_database_cannot_reach_one():
    completed = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", "from evidence.models import Run; print(Run.objects.count())"],
        cwd=PROJECT, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert completed.returncode != 0
    assert '"/a-test-that-did-not-ask-for-the-database/.s.PGSQL.5432" failed' in completed.stderr


def test_two_checkouts_get_two_postgresql_test_databases(tmp_path):
    """A developer's run and CI's, in another folder, at once: each drops and makes its own
    database, never the other's (both were ``test_test`` once, and aborted each other)."""
    other_checkout = tmp_path / "other-checkout"  # what the settings need of a checkout
    shutil.copytree(PROJECT / "evidence", other_checkout / "evidence", ignore=shutil.ignore_patterns("__pycache__"))
    (other_checkout / "tests").mkdir()
    for name in ("__init__.py", "settings.py"):
        shutil.copy(PROJECT / "tests" / name, other_checkout / "tests" / name)
    script = "from tests import settings; print(settings.DATABASES['default']['TEST']['NAME'])"
    env = {key: value for key, value in os.environ.items() if key != "CALLPROOF_TEST_DATABASE"}
    env["DATABASE_URL"] = "postgres://postgres@127.0.0.1:5432/postgres"
    names = [
        subprocess.run(
            [sys.executable, "-c", script], cwd=checkout, env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        for checkout in (PROJECT, other_checkout, PROJECT)
    ]
    assert names[0] == names[2], "one checkout keeps its name: a killed run's database is replaced, not left"
    assert names[0] != names[1] and all(name.startswith("test_callproof_") for name in names)
