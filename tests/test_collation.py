"""A re-import finds what changed in a bucket of call ids whatever the database's collation.

A re-import reads again the buckets of receipts whose digest changed (``rereading.Scope``),
each bucket a range of call ids (``call_id >= 'a9' AND call_id < 'a:'``): the names that
start with the bucket in byte order. A PostgreSQL database made with a language's collation
(ICU's ``en-US``, glibc's ``en_US.UTF-8``, what many servers are initialised with) sorts
``:`` before the digits, or ignores it: the range of every bucket that ends in ``9`` (one in
sixteen of the writer's hex call ids) was empty there, and a receipt removed from it kept its
call's ``receipt_present``. The call ids compare in byte order on every database (``"C"`` on
PostgreSQL, SQLite's ``BINARY``); this test imports the writer's files with the real
``import_runs`` into a database made with such a collation.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from receipts import runtime
from tests.helpers import CONTRACT
from tests.subprocess_db import manage, this_database_url

pytestmark = [pytest.mark.postgresql(reason="the collation is PostgreSQL's; SQLite compares by bytes (BINARY)")]

# A database's collation, as CREATE DATABASE takes it: each is tried until this server has one.
COLLATIONS = (
    "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'",  # PostgreSQL 15+ built with ICU
    "LOCALE_PROVIDER icu ICU_LOCALE 'en-US'",  # ... where C.UTF-8 is not a locale of the system
    "LC_COLLATE 'en_US.UTF-8' LC_CTYPE 'en_US.UTF-8'",  # glibc's, where the locale is installed
    "LC_COLLATE 'en_US.utf8' LC_CTYPE 'en_US.utf8'",
)


@pytest.fixture
def language_collated(django_db_setup) -> Iterator[str]:
    """The URL of a new database, migrated, whose collation does not sort as bytes do."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: the database's collation is PostgreSQL's")
    server, suite_database = this_database_url().rsplit("/", 1)
    database = f"{suite_database}_collated"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")  # a killed run's
        tried = []
        for collation in COLLATIONS:
            try:
                admin.execute(f"CREATE DATABASE {database} TEMPLATE template0 ENCODING 'UTF8' {collation}")
            except psycopg.Error as error:
                tried.append(f"{collation}: {str(error).strip()}")
                continue
            break
        else:
            pytest.skip("this PostgreSQL has no collation but bytes' order: " + "; ".join(tried))
        try:
            with psycopg.connect(f"{server}/{database}") as collated:
                row = collated.execute("SELECT 'a9' < 'a:'").fetchone()
            if row is None or row[0]:
                pytest.skip(f"the collation made with {collation} sorts 'a9' before 'a:' as bytes do")
            url = f"{server}/{database}"
            manage(url, "migrate", "-v", "0", check=True)
            yield url
        finally:
            admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def receipts_present(url: str) -> dict[str, bool]:
    with psycopg.connect(url) as database:
        return dict(database.execute("SELECT call_id, receipt_present FROM receipts_call").fetchall())


def test_a_receipt_removed_from_a_bucket_ending_in_9_is_seen_under_a_language_collation(language_collated, tmp_path):
    run = tmp_path / "root" / "run"
    runtime.run_init(run, contract_sha256=CONTRACT)
    executor = runtime.Executor(run, writer_socket="")
    calls: list[str] = []
    # The writer's call ids are hex digests: one in sixteen falls in a bucket such as "a9", "39".
    while not any(call_id[1] == "9" for call_id in calls):
        calls.append(executor.call("write_file", {"path": f"{len(calls)}.txt", "content": "x"}).call_id)
    [in_nine] = [call_id for call_id in calls if call_id[1] == "9"]
    manage(language_collated, "import_runs", str(tmp_path / "root"), check=True)
    assert receipts_present(language_collated) == dict.fromkeys(calls, True)

    receipt = run / "receipts" / f"{in_nine}.json"
    receipt.rename(run / f".removed-{receipt.name}")  # a dot name the reader never considers
    manage(language_collated, "import_runs", str(tmp_path / "root"), check=True)
    assert receipts_present(language_collated) == {call_id: call_id != in_nine for call_id in calls}
    # ... as a read of every file says
    manage(language_collated, "import_runs", "--force", str(tmp_path / "root"), check=True)
    assert receipts_present(language_collated) == {call_id: call_id != in_nine for call_id in calls}
