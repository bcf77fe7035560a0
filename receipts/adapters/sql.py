"""An SQL row as a tool's effect: one row per call, keyed by its call_id. Standard library only.

The database makes it exactly once: the key column is unique, and the row goes
in with ``INSERT ... ON CONFLICT (key) DO NOTHING``, then is read back; a
second insert of the same call (after a lost answer, or by another process)
finds the first. Works with any DB-API connection whose database has ``ON
CONFLICT`` (SQLite 3.24+, PostgreSQL 9.5+): the caller supplies ``connect()``,
this module imports no driver. Table and column names are configuration,
checked as plain identifiers and quoted; values always go as parameters.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sqlite3
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from receipts.tools import ABSENT, NOT_DONE, PRESENT, UNCLEAR, Evidence, Fact, OutcomeUnknown, Rejected, short_text

__all__ = ["SqlRow", "postgres_factory", "sqlite_factory"]

IDENTIFIER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# What create_table may declare a column as: names only, so no SQL comes in through a type either.
COLUMN_TYPES = frozenset({"TEXT", "INTEGER", "BIGINT", "REAL", "DOUBLE PRECISION", "BOOLEAN", "NUMERIC"})
# A statement the database refused: it wrote nothing, whatever the transaction mode.
_REFUSED = frozenset({"IntegrityError", "ProgrammingError", "DataError", "NotSupportedError"})


def _identifier(name: Any, what: str) -> str:
    if not isinstance(name, str) or not IDENTIFIER_RE.fullmatch(name):
        raise ValueError(f"{what} must be a plain identifier (letters, digits, _; 1-63), not {name!r}")
    return f'"{name}"'


def _refusal(error: BaseException) -> str | None:
    """The kind of rejection when a failed statement surely wrote nothing, else ``None``.

    SQLite runs in this process: a statement that failed was undone, whatever
    the error (busy, locked, full: retryable). A server's driver may lose the
    connection after the statement ran (in autocommit, it stays): only the
    errors by which the database refused the statement itself count.
    """
    if isinstance(error, sqlite3.Error):
        busy = getattr(error, "sqlite_errorname", "") in ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL")
        return "retryable" if busy else "permanent"
    return "permanent" if any(kind.__name__ in _REFUSED for kind in type(error).__mro__) else None


def _same(stored: Any, wanted: Any) -> bool:
    """Whether a value read back is the one written, under the column's type: SQLite gives 1 for
    True, the text "5" for 5 written to a TEXT column and the number 5 for "5" written to an
    INTEGER one (its type affinity); PostgreSQL gives a Decimal for NUMERIC."""
    if isinstance(stored, Decimal) and isinstance(wanted, float):
        return stored == Decimal(repr(wanted))
    if isinstance(stored, str) and isinstance(wanted, (bool, int)):
        return stored == str(int(wanted))
    if isinstance(stored, str) and isinstance(wanted, float):
        # SQLite writes a REAL as text with 15 significant digits: equal to that precision.
        try:
            return math.isclose(float(stored), wanted, rel_tol=1e-14, abs_tol=0.0)
        except ValueError:
            return False
    if isinstance(wanted, str) and isinstance(stored, (int, float)) and not isinstance(stored, bool):
        return _same(wanted, stored)
    return bool(stored == wanted) and (stored is None) == (wanted is None)


class SqlRow:
    """Inserts one row per call into ``table``: ``key_column`` = the call_id, ``columns`` = the args.

    ``connect()`` returns a new DB-API connection (closed after each use);
    ``None`` makes an adapter that only says where to look (for a dashboard
    that must not connect). ``paramstyle`` defaults to the driver module's.
    """

    def __init__(
        self,
        *,
        name: str,
        connect: Callable[[], Any] | None,
        table: str,
        columns: Sequence[str],
        key_column: str = "call_id",
        version: str = "1.0.0",
        paramstyle: str | None = None,
    ) -> None:
        self.name, self.version, self.connect = name, version, connect
        self.table, self.key_column, self.columns = table, key_column, tuple(columns)
        parts = table.split(".") if isinstance(table, str) else [table]
        if len(parts) > 2:
            raise ValueError(f"table must be NAME or SCHEMA.NAME, not {table!r}")
        self._table = ".".join(_identifier(part, "the table") for part in parts)
        self._key = _identifier(key_column, "the key column")
        if not self.columns or len(set(self.columns)) != len(self.columns) or key_column in self.columns:
            raise ValueError("columns must be one or more distinct names, without the key column")
        self._columns = [_identifier(column, "a column") for column in self.columns]
        if paramstyle not in (None, "qmark", "format", "pyformat", "numeric", "named"):
            raise ValueError(f"unknown paramstyle {paramstyle!r}")
        self.paramstyle = paramstyle

    # --- SQL, built from checked identifiers only -------------------------------

    def _statement(self, connection: Any, template: str, values: Sequence[Any]) -> tuple[str, Any]:
        driver = sys.modules.get(type(connection).__module__.split(".")[0])
        style = self.paramstyle or str(getattr(driver, "paramstyle", ""))
        names = [f"p{index}" for index in range(len(values))]
        marks = {
            "qmark": ["?"] * len(values),
            "format": ["%s"] * len(values),
            "pyformat": [f"%({name})s" for name in names],
            "numeric": [f":{index + 1}" for index in range(len(values))],
            "named": [f":{name}" for name in names],
        }.get(style)
        if marks is None:
            raise ValueError(f"the driver's paramstyle {style!r} is unknown: give SqlRow(paramstyle=...)")
        params = dict(zip(names, values, strict=True)) if style in ("pyformat", "named") else list(values)
        return template.format(*marks), params

    def _select(self, connection: Any, call_id: str) -> dict[str, Any] | None:
        columns = ", ".join([self._key, *self._columns])
        # Identifiers checked and quoted in __init__; the call_id goes as a parameter.
        template = f"SELECT {columns} FROM {self._table} WHERE {self._key} = {{0}}"  # noqa: S608
        sql, params = self._statement(connection, template, [call_id])
        cursor = connection.cursor()
        cursor.execute(sql, params)
        found = cursor.fetchone()
        return None if found is None else dict(zip([self.key_column, *self.columns], found, strict=True))

    def _open(self) -> Any:
        if self.connect is None:
            raise OutcomeUnknown(f"no connection is configured here: {self.where_to_look('this call')}")
        return self.connect()

    def where_to_look(self, call_id: str) -> str:
        return Fact("sql_look", table=self.table, column=self.key_column, call_id=call_id)

    # --- the adapter -------------------------------------------------------------

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(args, Mapping):
            raise Rejected("args must be a JSON object")
        unknown, missing = set(args) - set(self.columns), set(self.columns) - set(args)
        if unknown or missing:
            raise Rejected(f"args must be exactly {', '.join(self.columns)} (unknown: {sorted(unknown)}, "
                           f"missing: {sorted(missing)})")  # fmt: skip
        for column, value in args.items():
            if value is not None and not isinstance(value, (str, int, float)):
                raise Rejected(f"{column} must be a string, a number, true/false or null")
            if isinstance(value, float) and not math.isfinite(value):
                raise Rejected(f"{column} must be a finite number")
        return {column: args[column] for column in self.columns}

    def _result(self, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        return {"table": self.table, "key_column": self.key_column, "row": {self.key_column: call_id, **args}}

    def _matches(self, row: Mapping[str, Any], args: Mapping[str, Any]) -> bool:
        return all(_same(row[column], args.get(column)) for column in self.columns)

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        try:
            connection = self._open()
        except OutcomeUnknown as unknown:
            raise Rejected(str(unknown), kind="retryable") from None
        except Exception as error:  # noqa: BLE001 - no connection, nothing sent
            raise Rejected(f"cannot connect: {type(error).__name__}: {error}", kind="retryable") from None
        try:
            values = [call_id, *(args[column] for column in self.columns)]
            names = ", ".join([self._key, *self._columns])
            marks = ", ".join(f"{{{index}}}" for index in range(len(values)))
            insert = f"INSERT INTO {self._table} ({names}) VALUES ({marks}) ON CONFLICT ({self._key}) DO NOTHING"  # noqa: S608
            sql, params = self._statement(connection, insert, values)
            try:
                connection.cursor().execute(sql, params)
            except Exception as error:  # noqa: BLE001 - sorted below into refused and unknown
                kind = _refusal(error)
                if kind is not None:
                    message = f"the database refused the row: {type(error).__name__}: {error}"
                    raise Rejected(message, kind=kind) from None
                # A connection lost mid-statement may have written it (in autocommit, for one).
                raise OutcomeUnknown(f"the insert may have happened: {type(error).__name__}: {error}") from None
            try:
                row = self._select(connection, call_id)
                connection.commit()
            except Exception as error:  # noqa: BLE001 - after the insert, anything may have happened
                raise OutcomeUnknown(f"the insert was sent; then {type(error).__name__}: {error}") from None
        finally:
            _close(connection)
        if row is None:
            raise OutcomeUnknown(f"table {self.table} shows no row for this call right after inserting it")
        if not self._matches(row, args):
            raise OutcomeUnknown(f"table {self.table} has a row for this call_id with other values: {self._shown(row)}")
        return self._result(args, call_id)

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any] | object:
        """The result when the row is there, ``NOT_DONE`` when the SELECT finds no row; otherwise ``OutcomeUnknown``."""
        try:
            connection = self._open()
            try:
                row = self._select(connection, call_id)
            finally:
                _close(connection)
        except OutcomeUnknown:
            raise
        except Exception as error:  # noqa: BLE001 - a missing table, a lost connection: nothing proved
            raise OutcomeUnknown(f"table {self.table} cannot be read: {type(error).__name__}: {error}") from None
        if row is None:
            return NOT_DONE
        if not self._matches(row, args):
            raise OutcomeUnknown(f"table {self.table} has a row for this call_id with other values: {self._shown(row)}")
        return self._result(args, call_id)

    def evidence(
        self, run_dir: Path, args: Mapping[str, Any], call_id: str, result: Mapping[str, Any] | None = None
    ) -> Evidence:
        """The row keyed by the call_id, read only; ``present`` when it holds the call's args (and the result's row)."""
        look = self.where_to_look(call_id)
        if self.connect is None:
            return Evidence(UNCLEAR, (Fact("sql_not_connected", look=look),))
        try:
            connection = self.connect()
            try:
                row = self._select(connection, call_id)
            finally:
                _close(connection)
        except Exception as error:  # noqa: BLE001 - evidence never raises: it says what it could not read
            return Evidence(
                UNCLEAR, (Fact("sql_unreadable", table=self.table, error=f"{type(error).__name__}: {error}"), look)
            )
        if row is None:
            return Evidence(ABSENT, (Fact("sql_no_row", table=self.table, column=self.key_column, call_id=call_id),))
        fact = Fact("sql_row", table=self.table, column=self.key_column, call_id=call_id, row=self._shown(row))
        if not isinstance(args, Mapping) or not self._matches(row, args):
            return Evidence(UNCLEAR, (fact, Fact("sql_other_values")))
        if result is not None and (
            not isinstance(result, Mapping) or result.get("row") != self._result(args, call_id)["row"]
        ):
            return Evidence(UNCLEAR, (fact, Fact("sql_other_row")))
        return Evidence(PRESENT, (fact,))

    def _shown(self, row: Mapping[str, Any]) -> str:
        """The row's values for a sentence (the key is said beside it)."""
        return ", ".join(f"{column}={short_text(str(row[column]), 80)}" for column in self.columns)

    def describe(self, args: Any) -> str:
        return (
            f"Insert a row into table {self.table}, keyed by the call_id in {self.key_column}: {short_text(args, 300)}"
        )

    def create_table(self, types: Mapping[str, str] | None = None) -> None:
        """``CREATE TABLE IF NOT EXISTS``: the key column as the primary key, the others TEXT unless ``types`` says."""
        types = dict(types or {})
        bad = {column: kind for column, kind in types.items() if column not in self.columns or kind not in COLUMN_TYPES}
        if bad:
            raise ValueError(f"unknown column or type: {bad} (types: {', '.join(sorted(COLUMN_TYPES))})")
        declared = ", ".join(
            [f"{self._key} TEXT PRIMARY KEY"]
            + [
                f"{quoted} {types.get(column, 'TEXT')}"
                for column, quoted in zip(self.columns, self._columns, strict=True)
            ]
        )
        connection = self._open()
        try:
            connection.cursor().execute(f"CREATE TABLE IF NOT EXISTS {self._table} ({declared})")
            connection.commit()
        finally:
            _close(connection)


def _close(connection: Any) -> None:
    with contextlib.suppress(Exception):  # a broken connection is closed all the same
        connection.rollback()  # nothing of a read is kept open; a commit already made stays
    connection.close()


# --- zero-argument factories (the conformance kit, the dashboard's EVIDENCE_ADAPTERS) ---

EXAMPLE_COLUMNS = ("title", "body")


def sqlite_factory() -> SqlRow:
    """``sql_row`` into table ``notes`` (title, body) of the SQLite file ``CALLPROOF_SQL_SQLITE``.

    Unset, a file in a new temporary folder, and the variable is set to it, so
    that child processes (a kit that kills writers) share the one database.
    """
    path = os.environ.get("CALLPROOF_SQL_SQLITE")
    if not path:
        path = str(Path(tempfile.mkdtemp(prefix="callproof-sql-")) / "rows.sqlite3")
        os.environ["CALLPROOF_SQL_SQLITE"] = path
    adapter = SqlRow(
        name="sql_row", connect=lambda: sqlite3.connect(path, timeout=30), table="notes", columns=EXAMPLE_COLUMNS
    )
    adapter.create_table()

    def break_target() -> None:
        """The conformance kit's hook: from now on, in this process, the database has no table notes."""
        adapter.connect = lambda: sqlite3.connect(":memory:")

    adapter.break_target = break_target  # type: ignore[attr-defined]
    return adapter


def postgres_factory() -> SqlRow:
    """``sql_row`` into table ``notes`` (title, body) of the PostgreSQL database ``CALLPROOF_SQL_POSTGRES``
    (a conninfo or URL). Needs psycopg (the ``dashboard`` extra), imported here only."""
    import psycopg

    url = os.environ.get("CALLPROOF_SQL_POSTGRES")
    if not url:
        raise ValueError("CALLPROOF_SQL_POSTGRES must name the database (postgres://user@host:port/name)")
    adapter = SqlRow(name="sql_row", connect=lambda: psycopg.connect(url, connect_timeout=10), table="notes",
                     columns=EXAMPLE_COLUMNS)  # fmt: skip
    adapter.create_table()
    return adapter
