"""Where each test runs, said once: the suite's split between the two databases.

A test *uses the database* when it asks pytest-django for it: the ``django_db`` marker, or a
fixture built on ``django_db_setup`` (``db``, ``transactional_db``, ``live_server``, and every
fixture of ours that takes one of them). Such a test runs on SQLite and on PostgreSQL, because
the two differ where it matters (locks, time zones, sequences, what a query plan does). Every
other test (the writer, the reader, the protocol, the kill tests, the packaging) cannot fail
differently on another database, so it runs once. Browser tests run once, on PostgreSQL, which
is what a deployment serves.

`make test` runs the suite twice when PostgreSQL answers (docs/testing.md): everything on
PostgreSQL, then ``--database-tests-only`` on SQLite. Each pass writes what ran with
``--suite-record FILE``, and ``python -m tests.suite_split`` fails when a test that used the
database ran on one and not on the other. Without PostgreSQL, one pass on SQLite runs it all.

The split holds only if a test that uses the database says so. In the process, pytest-django
refuses a query from a test that did not ask. A child process is not watched by pytest-django,
so a test that did not ask gets a ``DATABASE_URL`` that no server answers: a child that reaches
for the database fails with the reason in its URL, instead of writing into whatever the
environment named.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from pathlib import Path

import pytest

DATABASE_FIXTURE = "django_db_setup"
# A socket folder that does not exist, so that the error a child prints names the cause:
# connection to server on socket "/a-test-that-did-not-ask-for-the-database/.s.PGSQL.5432" failed.
UNDECLARED_DATABASE_URL = "postgres://%2Fa-test-that-did-not-ask-for-the-database/undeclared"
# The user properties a record keeps; junit XML shows them too.
PROPERTIES = ("uses_database", "browser", "postgresql_only")


def uses_database(item: pytest.Item) -> bool:
    return item.get_closest_marker("django_db") is not None or DATABASE_FIXTURE in getattr(item, "fixturenames", ())


def database_vendor() -> str:
    from django.conf import settings

    return "postgresql" if "postgresql" in settings.DATABASES["default"]["ENGINE"] else "sqlite"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("callproof", "Callproof's suite")
    group.addoption(
        "--database-tests-only",
        action="store_true",
        help="run only the tests that use the database, browser tests aside (make test's second pass, on SQLite)",
    )
    group.addoption("--suite-record", metavar="FILE", help="write each test's outcome and whether it used the database")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("suite_record")
    if path and not hasattr(config, "workerinput"):  # on the controller, or a run without workers
        config.pluginmanager.register(SuiteRecord(Path(path)), "callproof-suite-record")


@pytest.hookimpl(wrapper=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_long_tests_first(items: list[pytest.Item]) -> Generator[None, None, None]:
    """The ``slow`` tests first, in pytest-randomly's order.

    pytest-xdist hands tests out in this order, so a long test left for the end keeps one worker
    busy while the other has nothing to do: 40 to 60 s of one idle core at the end of each pass.
    Before the yield of a wrapper, this runs after pytest-randomly's shuffle (a wrapper that goes
    first) and before pytest-django groups the tests by how they use the database, whatever order
    the plugins were registered in; its sort is stable, so each group starts with its long tests.
    The browser tests stay spread: most of their time is spent waiting on Chromium, and two at
    once would leave a core idle. (pytest reads only names that start with pytest_.)"""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    return (yield)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    on_sqlite = database_vendor() == "sqlite"
    only_database = config.getoption("database_tests_only")
    selected, deselected = [], []
    for item in items:
        database = uses_database(item)
        browser = item.get_closest_marker("browser") is not None
        postgresql = item.get_closest_marker("postgresql")
        item.user_properties.extend(
            [("uses_database", database), ("browser", browser), ("postgresql_only", postgresql is not None)]
        )
        if only_database and (not database or browser or (postgresql and on_sqlite)):
            deselected.append(item)
            continue
        if postgresql and on_sqlite:
            reason = postgresql.kwargs.get("reason") or "needs PostgreSQL"
            item.add_marker(pytest.mark.skip(reason=f"{reason} (make test runs it when 127.0.0.1:5432 answers)"))
        selected.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


@pytest.fixture(autouse=True)
def _no_undeclared_database(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if not uses_database(request.node):
        monkeypatch.setenv("DATABASE_URL", UNDECLARED_DATABASE_URL)


class SuiteRecord:
    """Each test's outcome, as the controller hears it (xdist's workers send their reports there),
    written to ``path`` at the end of the session."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tests: dict[str, dict[str, object]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # A test's outcome is its call's, or the setup's when that failed or skipped it.
        if report.when != "call" and report.outcome == "passed":
            return
        properties = dict(report.user_properties)
        entry = self.tests.setdefault(report.nodeid, {name: bool(properties.get(name)) for name in PROPERTIES})
        if entry.get("outcome") in (None, "passed"):  # a failed teardown after a passed call stays failed
            entry["outcome"] = report.outcome

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        document = {"database": database_vendor(), "tests": self.tests}
        self.path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
