"""The SQL row adapter on SQLite and on PostgreSQL: one row per call_id, made so by the database itself."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from receipts import protocol, runtime
from receipts.adapters.sql import SqlRow, postgres_factory, sqlite_factory
from receipts.demo import writer_env
from receipts.tools import ABSENT, NOT_DONE, PRESENT, UNCLEAR, OutcomeUnknown
from tests.adapter_children import ROW, sql_adapter
from tests.helpers import CONTRACT, PROJECT
from tests.subprocess_db import this_database_url


class Database:
    def __init__(self, url: str, connect: Callable[[], Any], table: str) -> None:
        self.url, self.connect, self.table = url, connect, table

    def adapter(self, **options: Any) -> SqlRow:
        return SqlRow(name="insert_note", connect=self.connect, table=self.table, columns=("title", "body"), **options)

    def rows(self) -> list[tuple]:
        connection = self.connect()
        try:
            cursor = connection.cursor()
            cursor.execute(f'SELECT call_id, title, body FROM "{self.table}" ORDER BY call_id')
            return list(cursor.fetchall())
        finally:
            connection.close()

    def run(self, sql: str) -> None:
        connection = self.connect()
        try:
            connection.cursor().execute(sql)
            connection.commit()
        finally:
            connection.close()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
def database(request, tmp_path) -> Iterator[Database]:
    table = f"notes_{uuid.uuid4().hex[:12]}"
    if request.param == "sqlite":
        url = f"sqlite:{tmp_path / 'rows.sqlite3'}"
    else:
        request.getfixturevalue("django_db_setup")  # pytest's own database, made for this session
        url = this_database_url()
    found = Database(url, sql_adapter(url, table).connect, table)  # type: ignore[arg-type]
    found.adapter().create_table()
    yield found
    found.run(f'DROP TABLE IF EXISTS "{table}"')


def test_a_call_inserts_one_row_keyed_by_its_call_id_and_a_second_call_reuses_it(run_dir, database):
    adapter = database.adapter()
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    first = executor.call(adapter.name, ROW)
    again = executor.call(adapter.name, ROW)
    assert first.status == "committed" and again.reused and first.call_id == again.call_id
    assert first.call_id == protocol.make_call_id(CONTRACT, 1, "insert_note", ROW, "1.0.0", protocol.IDENTITY_V2)
    assert database.rows() == [(first.call_id, ROW["title"], ROW["body"])], "the value went in as a parameter"
    assert first.result == {"table": database.table, "key_column": "call_id", "row": {"call_id": first.call_id, **ROW}}


def test_the_database_makes_it_once_when_the_writer_cannot(run_dir, database):
    """Two executes of one call_id (two runs of one contract, as after a lost answer): one row."""
    adapter = database.adapter()
    call_id = "c" * 64
    assert adapter.execute(run_dir, ROW, call_id) == adapter.execute(run_dir, ROW, call_id)
    assert len(database.rows()) == 1


def _killed_child(run_dir: Path, database: Database, failpoint: str) -> None:
    command = [sys.executable, "-m", "tests.adapter_children", "sql", str(run_dir), database.url, database.table]
    env = writer_env(RECEIPTS_FAILPOINT=failpoint)
    env["PYTHONPATH"] = f"{PROJECT}:{env['PYTHONPATH']}"
    assert subprocess.run(command, env=env, capture_output=True, check=False, cwd=PROJECT).returncode == 137


@pytest.mark.parametrize("failpoint", ["after_prepared", "after_effect"])
def test_a_killed_call_is_resumed_by_its_select(run_dir, database, failpoint):
    _killed_child(run_dir, database, failpoint)
    assert len(database.rows()) == (1 if failpoint == "after_effect" else 0)
    adapter = database.adapter()
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, ROW)
    assert outcome.status == "committed" and outcome.reused == (failpoint == "after_effect")
    assert database.rows() == [(outcome.call_id, ROW["title"], ROW["body"])]


def test_no_row_is_not_done_only_when_the_table_answers(run_dir, database):
    adapter = database.adapter()
    assert adapter.query(run_dir, ROW, "d" * 64) is NOT_DONE
    assert adapter.evidence(run_dir, ROW, "d" * 64).verdict == ABSENT
    database.run(f'DROP TABLE "{database.table}"')
    with pytest.raises(OutcomeUnknown, match="cannot be read"):
        adapter.query(run_dir, ROW, "d" * 64)
    evidence = adapter.evidence(run_dir, ROW, "d" * 64)
    assert evidence.verdict == UNCLEAR and f"for the row whose call_id is {'d' * 64}" in evidence.facts[-1]


def test_a_missing_table_leaves_a_prepared_call_in_doubt(run_dir, database):
    _killed_child(run_dir, database, "after_prepared")
    database.run(f'DROP TABLE "{database.table}"')
    adapter = database.adapter()
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, ROW)
    assert outcome.status == "prepared" and outcome.needs == "confirmation", "no table proves nothing"
    assert "cannot be read" in (outcome.error or {})["message"]


def test_no_connection_is_retryable_and_a_missing_table_is_refused(run_dir, database):
    adapter = database.adapter()
    adapter.connect = _refusing
    refused = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, ROW)
    assert refused.status == "rejected" and (refused.error or {})["kind"] == "retryable", "no connection: nothing sent"
    database.run(f'DROP TABLE "{database.table}"')
    adapter.connect = database.connect
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, {**ROW, "title": "another"})
    assert outcome.status == "rejected" and (outcome.error or {})["kind"] == "permanent"
    assert "the database refused the row" in (outcome.error or {})["message"]


def _refusing() -> Any:
    raise ConnectionRefusedError("the database is down")


def test_a_row_with_other_values_under_the_call_id_is_not_taken_for_the_effect(run_dir, database):
    adapter = database.adapter()
    call_id = "e" * 64
    adapter.execute(run_dir, {"title": "other", "body": "values"}, call_id)
    with pytest.raises(OutcomeUnknown, match="other values"):
        adapter.execute(run_dir, ROW, call_id)
    with pytest.raises(OutcomeUnknown, match="other values"):
        adapter.query(run_dir, ROW, call_id)
    assert adapter.evidence(run_dir, ROW, call_id).verdict == UNCLEAR
    assert len(database.rows()) == 1


def test_evidence_reads_the_row_and_checks_the_recorded_result(run_dir, database):
    adapter = database.adapter()
    result = adapter.execute(run_dir, ROW, "f" * 64)
    present = adapter.evidence(run_dir, ROW, "f" * 64, result=result)
    assert present.verdict == PRESENT and f"title={ROW['title']}" in present.facts[0]
    other = {**result, "row": {**result["row"], "title": "edited"}}
    assert adapter.evidence(run_dir, ROW, "f" * 64, result=other).verdict == UNCLEAR


def test_a_refused_statement_is_rejected_with_nothing_written(run_dir, database):
    database.run(f'DROP TABLE "{database.table}"')
    database.run(f'CREATE TABLE "{database.table}" (call_id TEXT PRIMARY KEY, title TEXT NOT NULL, body TEXT)')
    adapter = database.adapter()
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, {"title": None, "body": "x"})
    assert outcome.status == "rejected" and (outcome.error or {})["kind"] == "permanent"
    assert "the database refused the row: " in (outcome.error or {})["message"]
    assert database.rows() == []


def test_without_a_unique_key_the_adapter_refuses_rather_than_insert_twice(run_dir, database):
    database.run(f'DROP TABLE "{database.table}"')
    database.run(f'CREATE TABLE "{database.table}" (call_id TEXT, title TEXT, body TEXT)')
    adapter = database.adapter()
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, ROW)
    assert outcome.status == "rejected" and (outcome.error or {})["kind"] == "permanent", outcome
    assert database.rows() == []


def test_concurrent_processes_calling_one_call_id_make_exactly_one_row(tmp_path, database):
    """Six writers in six runs of one contract (one call_id), started together: the database's unique key decides."""
    start = tmp_path / "start"
    env = writer_env(START_FILE=str(start))
    env["PYTHONPATH"] = f"{PROJECT}:{env['PYTHONPATH']}"
    children = []
    for n in range(6):
        run = tmp_path / f"run-{n}"
        runtime.run_init(run, contract_sha256=CONTRACT)
        command = [sys.executable, "-m", "tests.adapter_children", "sql", str(run), database.url, database.table]
        children.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=PROJECT))
    start.touch()
    outcomes = []
    for child in children:
        stdout, stderr = child.communicate(timeout=120)
        assert child.returncode == 0, stderr
        outcomes.append(json.loads(stdout))
    assert {outcome["status"] for outcome in outcomes} == {"committed"}
    assert not any(outcome["reused"] for outcome in outcomes), "each writer sent its own insert"
    assert len({json.dumps(outcome["result"], sort_keys=True) for outcome in outcomes}) == 1
    [row] = database.rows()
    assert row[0] == outcomes[0]["call_id"]


@pytest.mark.parametrize("name", ['notes"; DROP TABLE x; --', "1notes", "a.b.c", "", "no-tes", "x" * 64])
def test_names_are_identifiers_or_refused(name):
    with pytest.raises(ValueError, match=r"identifier|SCHEMA\.NAME"):
        SqlRow(name="t", connect=None, table=name, columns=("title",))
    with pytest.raises(ValueError, match="identifier"):
        SqlRow(name="t", connect=None, table="notes", columns=(name or "-",))


def test_args_are_the_configured_columns_and_json_values(run_dir, tmp_path):
    adapter = SqlRow(
        name="t", connect=lambda: sqlite3.connect(tmp_path / "x.sqlite3"), table="notes", columns=("title", "body")
    )
    executor = runtime.Executor(run_dir, {"t": adapter})
    for args in ({"title": "x"}, {"title": "x", "body": "y", "extra": 1}, {"title": [1], "body": "y"}):
        outcome = executor.call("t", args)
        assert outcome.status == "rejected" and (outcome.error or {})["kind"] == "permanent", args


def test_a_dashboard_without_a_connection_says_where_to_look(run_dir):
    adapter = SqlRow(name="insert_note", connect=None, table="billing.notes", columns=("title", "body"))
    evidence = adapter.evidence(run_dir, ROW, "a" * 64)
    assert evidence.verdict == UNCLEAR
    assert evidence.facts == (f"this dashboard does not connect to the database: look in table billing.notes "
                              f"for the row whose call_id is {'a' * 64}",)  # fmt: skip
    assert adapter.describe(ROW).startswith("Insert a row into table billing.notes, keyed by the call_id in call_id")


def test_the_zero_argument_factory_shares_its_file_with_child_processes(run_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("CALLPROOF_SQL_SQLITE", raising=False)
    adapter = sqlite_factory()
    path = Path(__import__("os").environ["CALLPROOF_SQL_SQLITE"])
    assert path.is_file() and sqlite_factory().connect is not None
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, {"title": "a", "body": "b"})
    assert outcome.status == "committed"
    assert sqlite3.connect(path).execute("SELECT call_id FROM notes").fetchall() == [(outcome.call_id,)]


@pytest.mark.postgresql
def test_the_postgresql_factory_reads_its_database_from_the_environment(run_dir, monkeypatch, request):
    request.getfixturevalue("django_db_setup")
    monkeypatch.setenv("CALLPROOF_SQL_POSTGRES", this_database_url())
    adapter = postgres_factory()
    try:
        outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, {"title": "a", "body": "b"})
        assert (
            outcome.status == "committed"
            and adapter.query(run_dir, {"title": "a", "body": "b"}, outcome.call_id) == outcome.result
        )
    finally:
        Database(this_database_url(), adapter.connect, "notes").run('DROP TABLE "notes"')  # type: ignore[arg-type]


def test_a_number_given_for_a_text_column_reads_back_as_the_same_row_on_sqlite(run_dir, tmp_path):
    """SQLite stores 5 given for a TEXT column as "5": compared as it was given, the row never
    matched, and the call stayed in doubt for ever. Compared under the column's type, it does."""
    url = f"sqlite:{tmp_path / 'rows.sqlite3'}"
    database = Database(url, sql_adapter(url, "notes").connect, "notes")  # type: ignore[arg-type]
    database.adapter().create_table()
    adapter = database.adapter()
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    row = {"title": 5, "body": 2.5}
    first = executor.call(adapter.name, row)
    again = executor.call(adapter.name, row)
    assert first.status == "committed" and again.reused and again.needs is None
    assert database.rows() == [(first.call_id, "5", "2.5")]
    assert adapter.query(run_dir, row, first.call_id) == first.result
    with pytest.raises(OutcomeUnknown, match="other values"):
        adapter.query(run_dir, {"title": 6, "body": 2.5}, first.call_id)

    # The other way: text given for INTEGER and REAL columns, stored as numbers.
    numbers = Database(url, sql_adapter(url, "amounts").connect, "amounts")  # type: ignore[arg-type]
    numbers.adapter().create_table({"title": "INTEGER", "body": "REAL"})
    adapter = numbers.adapter()
    as_text = {"title": "7", "body": "2.25"}
    made = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, as_text)
    assert made.status == "committed" and numbers.rows() == [(made.call_id, 7, 2.25)]
    assert adapter.query(run_dir, as_text, made.call_id) == made.result
