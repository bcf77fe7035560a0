"""How does what an import read become rows? In bulk, one import of a run at a time.

``bulk_upsert`` is how every row goes in: ``INSERT ... ON CONFLICT``, so that a second
import cannot duplicate anything (SQLite: one ``executemany``; PostgreSQL: ``COPY`` into a
temporary table, then one insert from it). ``run_import_lock`` lets one import at a time
work on a run: a PostgreSQL advisory lock, or on SQLite a ``flock`` beside the database file.
Findings are upserted (a closed one reopens) and closed, never deleted, once not seen again.
The other files' records replace their rows, and a receipt that was not read again is
written back only when its judgement changed. After a big import, PostgreSQL's statistics
are refreshed (``refresh_planner_statistics``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from django.db import connection
from django.db.models import DateTimeField, Model

from evidence.ingest import read_ahead
from evidence.ingest.read_ahead import JSON, KEEP, TIME
from evidence.ingest.read_ahead import db_time as _time
from evidence.models import Call, Confirmation, Finding, JSONTextField, Run, Submission
from evidence.review import triage
from receipts import durable
from receipts.findings import FindingRecord
from receipts.reader import CallRecord, RunFiles

# --- raw bulk writes -------------------------------------------------------


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


# Up to this many rows, PostgreSQL takes them as one pipelined ``executemany`` (psycopg sends them
# without waiting for each answer): the temporary table's CREATE and DROP change the catalogue and
# cost more than the rows themselves when an import brings a few new lines or files.
FEW_ROWS = 1000


def bulk_upsert(
    model: type[Model],
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    conflict: Sequence[str],
    update: bool,
    insert_only: Sequence[str] = (),
) -> None:
    """INSERT ... ON CONFLICT for many rows, the fastest way each database offers.

    With ``update``, a conflicting row takes the new values, but for ``insert_only``
    columns (a first-seen time) which keep the old.

    SQLite: one ``executemany``. PostgreSQL: ``COPY`` into a temporary table,
    then one ``INSERT ... SELECT ... ON CONFLICT`` (COPY alone cannot skip or
    update a conflicting row). Must run inside a transaction.
    """
    rows = list(rows)
    if not rows:
        return
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    names = ", ".join(quote(c) for c in columns)
    # Table and column names come from the models, never from input.
    on_conflict = f"ON CONFLICT ({', '.join(quote(c) for c in conflict)}) "
    if update:
        on_conflict += "DO UPDATE SET " + ", ".join(
            f"{quote(c)} = excluded.{quote(c)}" for c in columns if c not in conflict and c not in insert_only
        )
    else:
        on_conflict += "DO NOTHING"
    with connection.cursor() as cursor:
        if not is_postgres() or len(rows) <= FEW_ROWS:
            placeholders = ", ".join(["%s"] * len(columns))
            cursor.executemany(f"INSERT INTO {table} ({names}) VALUES ({placeholders}) {on_conflict}", rows)  # noqa: S608
            return
        stage = quote(f"stage_{model._meta.db_table}")
        cursor.execute(f"DROP TABLE IF EXISTS {stage}")
        cursor.execute(f"CREATE TEMPORARY TABLE {stage} AS SELECT {names} FROM {table} WITH NO DATA")  # noqa: S608
        with cursor.cursor.copy(f"COPY {stage} ({names}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        cursor.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {stage} {on_conflict}")  # noqa: S608
        cursor.execute(f"DROP TABLE {stage}")


# --- locking ---------------------------------------------------------------


@contextlib.contextmanager
def run_import_lock(run_id: str) -> Iterator[None]:
    """Serialise imports of one run across processes; no other lock is held meanwhile."""
    if is_postgres():
        key = int.from_bytes(hashlib.sha256(f"callproof-import:{run_id}".encode()).digest()[:8], "big", signed=True)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [key])
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
        return
    name = str(connection.settings_dict["NAME"])
    if name.startswith("file:") or name == ":memory:":
        yield  # an in-memory database belongs to one process
        return
    with durable.exclusive_lock(Path(f"{name}.import.lock"), root=None):
        yield


# --- findings --------------------------------------------------------------


FINDING_VALUES = (
    "detail", "severity", "scope", "call_id", "stored_value", "recomputed_value", "evidence", "record_key",
    "sentence", "detail_values",
)  # fmt: skip


def _as_column(record: FindingRecord, name: str) -> Any:
    """A finding's value as the bulk upsert's raw SQL takes it: JSON as its text."""
    value = getattr(record, name)
    return json.dumps(value, ensure_ascii=False) if name == "detail_values" else value


def store_findings(run: Run | None, findings: Iterable[FindingRecord], now: dt.datetime, root: str = "") -> set:
    """Upsert findings (reopening closed ones) in bulk; returns their (code, subject) keys.
    On ``run``, or with none, on the runs ``root``: what a read of the files found, or
    something else (a decision its host could not deliver).

    A run's findings go in as one upsert however many there are (a hostile ledger
    can have a hundred thousand broken lines). Findings about a runs root, a few
    at most, are matched one by one: their uniqueness is a partial index, which
    ``ON CONFLICT`` would have to name with its condition.
    """
    # One row a key, the last record of it: the newest line about a problem (a second conflict
    # for one submission) says what a later, incremental read would have stored.
    latest = {(record.code, record.subject[:400]): record for record in findings}
    keys, unique = set(latest), list(latest.values())
    if run is None:
        for record in unique:
            lookup = {"run": None, "root": root, "code": record.code, "subject": record.subject[:400]}
            values = {name: getattr(record, name) for name in FINDING_VALUES} | {"last_seen": now, "closed_at": None}
            if not Finding.objects.filter(**lookup).update(**values):
                Finding.objects.create(**lookup, **values, first_seen=now)
        return keys
    triage.end_on_change(run, unique, now)
    moment = _time(now, is_postgres())
    columns = ("run_id", "code", "subject", *FINDING_VALUES, "root", "first_seen", "last_seen", "closed_at")
    rows = (
        (run.pk, r.code, r.subject[:400], *(_as_column(r, name) for name in FINDING_VALUES), "", moment, moment, None)
        for r in unique
    )
    bulk_upsert(
        Finding, columns, rows, conflict=("run_id", "code", "subject"), update=True, insert_only=("first_seen",)
    )
    return keys


def close_findings_not_seen(
    findings: Any, seen: set, now: dt.datetime, rechecked: Callable[[str, str], bool] | None = None
) -> None:
    """Close the open ``findings`` not ``seen`` again; of those ``rechecked(call_id, subject)``
    says were looked at, when only some were."""
    rows = findings.filter(closed_at__isnull=True).values_list("id", "code", "subject", "call_id")
    gone = [
        finding_id
        for finding_id, code, subject, call_id in rows
        if (code, subject) not in seen and (rechecked is None or rechecked(call_id, subject))
    ]
    for chunk in chunks(gone):
        Finding.objects.filter(id__in=chunk).update(closed_at=now)


def open_findings_of(run: Run) -> list[dict[str, str]]:
    rows = run.findings.filter(closed_at__isnull=True).order_by("code", "subject")
    return [{"code": f.code, "subject": f.subject, "detail": f.detail} for f in rows]


def chunks(values: Sequence[str], size: int = 500) -> Iterator[Sequence[str]]:
    """``values`` a few hundred at a time: one ``IN (...)`` per chunk stays within every database's limits."""
    for start in range(0, len(values), size):
        yield values[start : start + size]


# --- the other files' rows -------------------------------------------------


def _store_records(
    run: Run,
    model: type[Model],
    records: Sequence[Any],
    key: str,
    kept: frozenset = frozenset(),
    among: set[str] | None = None,
) -> None:
    """Upsert one kind of record (the reader's dataclasses name the columns), then delete
    the rows whose file is gone (of the keys ``among``, when only those were read). Rows
    keyed in ``kept`` stay as they are."""
    present = {getattr(record, key) for record in records} | kept
    records = [record for record in records if getattr(record, key) not in kept]
    names = [field.name for field in dataclasses.fields(records[0])] if records else []
    rows = read_ahead.record_rows(run.pk, records, conversions(model, names), is_postgres())
    _store_rows(run, model, ("run_id", *names), rows, key, present, among)


def conversions(model: type[Model], names: Sequence[str]) -> list[tuple[str, str]]:
    """How each column's value is written (``read_ahead.record_rows``), from the model's fields."""
    fields = {field.name: field for field in model._meta.concrete_fields}
    return [
        (name, JSON if isinstance(fields[name], JSONTextField) else TIME if isinstance(fields[name], DateTimeField)
         else KEEP)
        for name in names
    ]  # fmt: skip


def _store_rows(
    run: Run,
    model: type[Model],
    columns: Sequence[str],
    rows: list[tuple[Any, ...]],
    key: str,
    present: set[str] | frozenset[str],
    among: set[str] | None,
) -> None:
    """``_store_records``' writes, of rows already made: upsert them, then delete the rows
    of keys not ``present`` (of the keys ``among``, when only those were read)."""
    if rows:
        bulk_upsert(model, columns, rows, conflict=("run_id", key), update=True)
    existing = model._default_manager.filter(run=run)
    if among is None:
        stored = set(existing.values_list(key, flat=True))
    else:
        stored = {
            k
            for chunk in chunks(sorted(among))
            for k in existing.filter(**{f"{key}__in": chunk}).values_list(key, flat=True)
        }
    for chunk in chunks(sorted(stored - present)):
        existing.filter(**{f"{key}__in": chunk}).delete()


def judgement(call: CallRecord) -> tuple[str, str, str, bool]:
    """What may change for a receipt that is not read again: the ledger or a confirmation judge it anew."""
    return call.verification, call.decision, call.decision_reason, call.queryable


CALL_FIELDS = tuple(field.name for field in dataclasses.fields(CallRecord))


def store_files(
    run: Run,
    files: RunFiles,
    judged_before: dict[str, tuple[str, str, str, bool]],
    among: set[str] | None,
    calls: bool = True,
) -> None:
    """Store what was read of the run's other files (its calls too, unless ``calls`` is false:
    then they were stored as they came, ``store_call_batches``)."""
    # A reused record is written back only when its judgement changed (a confirmation, a refused reuse).
    kept = frozenset(files.reused_calls)
    if calls:
        _store_records(run, Call, files.calls, "call_id", kept, among)
    for call in files.calls:
        if call.call_id in kept and judged_before.get(call.call_id) != judgement(call):
            Call.objects.filter(run=run, call_id=call.call_id).update(
                verification=call.verification,
                decision=call.decision,
                decision_reason=call.decision_reason,
                queryable=call.queryable,
            )
    _store_records(run, Submission, files.submissions, "client_submission_id")
    _store_records(run, Confirmation, files.confirmations, "call_id")


def store_call_batches(run: Run, batches: Iterable[list[tuple[Any, ...]]]) -> int:
    """Store a run's every call, read whole (none reused), from rows (``run_id``, then
    ``CALL_FIELDS``) that come a batch at a time; the run's other call rows are deleted.
    Returns how many were stored. Only a run that had calls (a forced import) has their ids
    held, to delete those not read again."""
    columns = ("run_id", *CALL_FIELDS)
    read: set[str] | None = set() if Call.objects.filter(run=run).exists() else None
    stored = 0
    for rows in batches:
        bulk_upsert(Call, columns, rows, conflict=("run_id", "call_id"), update=True)
        stored += len(rows)
        if read is not None:
            read.update(row[1] for row in rows)
    if read is not None:
        _store_rows(run, Call, columns, [], "call_id", read, None)
    return stored


# --- the planner's statistics ----------------------------------------------

# PostgreSQL plans each query on its statistics of the tables, which autovacuum refreshes a
# minute or more after a bulk load. Until then a million events just stored look like a few, and
# the next import's look-ups of some calls' events and receipts scan the run's every row instead
# of the (run, call_id) indexes: 0.3 s for 500 calls, seconds for one changed receipt. An import
# that grows a table by more than a tenth (autovacuum's own default) refreshes them itself;
# below this many rows, what the planner thinks costs little either way.
STATISTICS_AFTER_ROWS = 10_000
STATISTICS_GROWTH = 0.1


def refresh_planner_statistics(stored: dict[type[Model], int]) -> None:
    """ANALYZE, on PostgreSQL, each table that ``stored`` (rows written, by model) grew by more
    than ``STATISTICS_GROWTH`` of what the planner thinks it holds. SQLite keeps no statistics
    unless asked, and the queries are written for a planner without them."""
    if not is_postgres():
        return
    with connection.cursor() as cursor:
        for model, rows in stored.items():
            if rows < STATISTICS_AFTER_ROWS:
                continue
            table = model._meta.db_table
            cursor.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [table])
            (estimate,) = cursor.fetchone()
            if estimate < 0 or rows > STATISTICS_GROWTH * estimate:  # -1: never analysed
                cursor.execute(f"ANALYZE {connection.ops.quote_name(table)}")
