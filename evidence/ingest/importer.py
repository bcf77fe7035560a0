"""Importing run directories into the database: idempotent, incremental, crash-safe.

``run_import`` takes one run: the ledger is read from where the last import
stopped, in batches, each committed together with the cursor that follows
it; then everything else is read and stored in one transaction. A run whose
files have not changed (same stat fingerprint) and whose stale-age horizon
has not passed is skipped. Rows go in through ``executemany`` with
``ON CONFLICT`` upserts: a second import cannot duplicate anything, and a
killed import leaves committed batches that the next one builds on.

One import at a time per run: a PostgreSQL advisory lock, or on SQLite a
``flock`` beside the database file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import DateTimeField, Model, Q

from evidence import models
from evidence.ingest import read_ahead
from evidence.ingest.read_ahead import JSON, KEEP, TIME, PreparedBatch, PreparedFiles, ReadAhead, ReadAheadError
from evidence.ingest.read_ahead import db_time as _time
from evidence.lib import hosts, stats
from evidence.models import Call, Confirmation, Event, Finding, Host, HumanDecision, JSONTextField, Run, Submission
from evidence.review import triage
from receipts import durable, protocol, signing
from receipts.findings import ACTIVITY as ACTIVITY_SCOPE
from receipts.findings import FILES, LEDGER, FindingRecord, Sentence, storable_text
from receipts.reader import (
    BATCH_EVENTS,
    DEFAULT_LIMITS,
    CallRecord,
    LedgerCursor,
    Limits,
    RunFiles,
    birth_digest,
    discover_runs,
    looks_like_run,
    read_ledger,
    read_run_files,
    run_fingerprint,
)
from receipts.reader.files import run_signing_key
from receipts.reader.safe_open import signature_from
from receipts.replay import apply_decisions

log = logging.getLogger("callproof.importer")

Progress = Callable[[str, int, int], None]  # run_id, ledger bytes read, ledger size

# Findings the reader makes again on every read from the records, reused or not.
# Findings the reader makes again for receipts it does not read again (from the ledger and the clock).
RECOMPUTED_EVERY_READ = (
    "stale_call",
    "orphan_receipt",
    "missing_receipt",
    "committed_event_missing",
    "effect_not_shown",
    "import_failed",
)


@dataclasses.dataclass
class RunReport:
    run_id: str
    calls: int
    events: int
    submissions: int
    findings: list[dict[str, str]]
    changed: bool
    failed: bool = False  # the import raised: an import_failed finding says why

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "calls": self.calls,
            "events": self.events,
            "submissions": self.submissions,
            "findings": self.findings,
        }


@dataclasses.dataclass
class ImportReport:
    runs: list[RunReport]
    root_findings: list[dict[str, str]]

    def as_dict(self) -> dict[str, Any]:
        document: dict[str, Any] = {"runs": [run.as_dict() for run in self.runs]}
        if self.root_findings:
            document["root_findings"] = self.root_findings
        return document


# --- raw bulk writes -------------------------------------------------------


def _is_postgres() -> bool:
    return connection.vendor == "postgresql"


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
        if not _is_postgres():
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
    if _is_postgres():
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


def _store_findings(run: Run | None, findings: Iterable[FindingRecord], now: dt.datetime, root: str = "") -> set:
    """Upsert findings (reopening closed ones) in bulk; returns their (code, subject) keys.

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
    moment = _time(now, _is_postgres())
    columns = ("run_id", "code", "subject", *FINDING_VALUES, "root", "first_seen", "last_seen", "closed_at")
    rows = (
        (run.pk, r.code, r.subject[:400], *(_as_column(r, name) for name in FINDING_VALUES), "", moment, moment, None)
        for r in unique
    )
    bulk_upsert(
        Finding, columns, rows, conflict=("run_id", "code", "subject"), update=True, insert_only=("first_seen",)
    )
    return keys


def store_findings(run: Run, findings: Iterable[FindingRecord], now: dt.datetime) -> set:
    """Open (or keep open) findings on ``run`` that something other than a read of its files
    found (a decision its host could not deliver)."""
    return _store_findings(run, findings, now)


def _close_findings_not_seen(
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
    for chunk in _chunks(gone):
        Finding.objects.filter(id__in=chunk).update(closed_at=now)


def open_findings_of(run: Run) -> list[dict[str, str]]:
    rows = run.findings.filter(closed_at__isnull=True).order_by("code", "subject")
    return [{"code": f.code, "subject": f.subject, "detail": f.detail} for f in rows]


# --- the ledger ------------------------------------------------------------

EVENT_COLUMNS = (
    "run_id",
    "seq",
    "line_no",
    "ts",
    "type",
    "call_id",
    "client_submission_id",
    "disposition",
    "request_digest",
    "line_sha256",
    "payload",
    "status",
)


# Run column <-> LedgerCursor field: the cursor is stored with each batch and read back from these.
CURSOR_COLUMNS = (
    ("ledger_offset", "offset"),
    ("ledger_prefix_sha256", "prefix_sha256"),
    ("ledger_last_seq", "last_seq"),
    ("ledger_last_line_sha256", "last_line_sha256"),
    ("ledger_line_no", "line_no"),
    ("ledger_chained", "chained"),
    ("first_event_at", "first_ts"),
    ("last_event_at", "last_ts"),
)


def _cursor_of(run: Run) -> LedgerCursor:
    """Where the last import stopped, and the submissions' first digests (the ledger's reader
    checks each new line against them). The sets of calls start empty: after the read they
    name the calls of the new lines only, unless the whole ledger was read (``_import_ledger``)."""
    cursor = LedgerCursor(**{field: getattr(run, column) for column, field in CURSOR_COLUMNS})
    if run.ledger_offset:
        events = Event.objects.filter(run=run)
        submissions = events.filter(type="submission", client_submission_id__gt="").exclude(request_digest="")
        for submission_id, digest in submissions.order_by("seq").values_list("client_submission_id", "request_digest"):
            cursor.submission_digests.setdefault(submission_id, digest)
    return cursor


def _ledger_calls(run: Run, cursor: LedgerCursor, among: set[str] | None) -> None:
    """Set the cursor's sets of calls from the stored events: those the ledger names, those
    whose commit it records, those whose last reuse was refused; of ``among`` only, or of all."""
    cursor.call_ids, cursor.committed_call_ids, cursor.disputed_call_ids = set(), set(), set()
    # Unordered: the model's order (run, seq) would have SQLite walk the run's every event by seq.
    events = Event.objects.filter(run=run).order_by()
    if among is None:
        # "> ''" rather than "<> ''": a range on the (run, call_id, seq) index skips the events
        # that name no call (most of a long ledger) instead of reading past them.
        cursor.call_ids.update(events.filter(call_id__gt="").values_list("call_id", flat=True).distinct())
        commits = events.filter(type="receipt", status="committed")
        cursor.committed_call_ids.update(commits.values_list("call_id", flat=True))
        reuses = events.filter(type__in=REUSE_EVENTS, call_id__gt="").order_by("seq").values_list("type", "call_id")
        _follow_reuses(cursor, reuses)
        return
    # A few calls: each one's events through the (run, call_id, seq) index, sorted here (without
    # statistics, SQLite would rather walk the (run, type) index through a million events).
    named = [
        row
        for chunk in _chunks(sorted(among))
        for row in events.filter(call_id__in=chunk).values_list("seq", "type", "status", "call_id")
    ]
    named.sort()
    cursor.call_ids.update(call_id for _, _, _, call_id in named)
    cursor.committed_call_ids.update(
        call_id for _, event_type, status, call_id in named if event_type == "receipt" and status == "committed"
    )
    _follow_reuses(cursor, ((event_type, call_id) for _, event_type, _, call_id in named if event_type in REUSE_EVENTS))


REUSE_EVENTS = ("reuse_refused", "call_reused")


def _follow_reuses(cursor: LedgerCursor, reuses: Iterable[tuple[str, str]]) -> None:
    """A call is disputed while its last reuse event, in the ledger's order, is a refusal."""
    for event_type, call_id in reuses:
        if event_type == "reuse_refused":
            cursor.disputed_call_ids.add(call_id)
        else:
            cursor.disputed_call_ids.discard(call_id)


def _chunks(values: Sequence[str], size: int = 500) -> Iterator[Sequence[str]]:
    """``values`` a few hundred at a time: one ``IN (...)`` per chunk stays within every database's limits."""
    for start in range(0, len(values), size):
        yield values[start : start + size]


# A child reads ahead (``evidence.ingest.read_ahead``) when there is this much to read: below it,
# starting a process costs about what it would save.
READ_AHEAD_LEDGER_BYTES = 16 << 20  # some 35,000 events
READ_AHEAD_RECEIPTS = 10_000


@dataclasses.dataclass
class _Ahead:
    """The children that read a run for one import, when they are worth starting: one reads
    the ledger while this process stores it; another the other files meanwhile, when this
    import reads them all with none known. ``stack`` kills and reaps them when it closes."""

    stack: contextlib.ExitStack
    run: Run
    file_arguments: dict[str, Any] | None  # read_run_files' arguments, when the files are read ahead
    decided: dict[str, tuple[str, str]]
    files_child: ReadAhead | None = None

    def _start(self, request: read_ahead.Request) -> ReadAhead | None:
        try:
            return self.stack.enter_context(ReadAhead(request))
        except ReadAheadError as failure:
            _read_here(self.run.run_id, failure)
            return None

    def start_files(self, receipts: int) -> None:
        if self.file_arguments is None or receipts < READ_AHEAD_RECEIPTS:
            return
        self.files_child = self._start(
            read_ahead.Request(
                Path(self.file_arguments["run_dir"]), self.run.pk, _is_postgres(),
                files={name: value for name, value in self.file_arguments.items() if name != "run_dir"},
                decided=self.decided, call_conversions=_conversions(Call, CALL_FIELDS),
            )
        )  # fmt: skip

    def start_ledger(
        self,
        path: Path,
        cursor: LedgerCursor,
        limits: Limits,
        batch_size: int,
        signing_key: protocol.SigningKey | None,
        ledger_size: int,
    ) -> ReadAhead | None:
        if ledger_size - self.run.ledger_offset < READ_AHEAD_LEDGER_BYTES:
            return None
        request = read_ahead.Request(path, self.run.pk, _is_postgres(), cursor, limits, batch_size, signing_key)
        return self._start(request)

    def prepared_files(self, cursor: LedgerCursor) -> PreparedFiles | None:
        """The other files as the child read them against ``cursor`` (the whole ledger's), or
        ``None``: read them here."""
        if self.files_child is None:
            return None
        try:
            return self.files_child.files(cursor)
        except ReadAheadError as failure:
            _read_here(self.run.run_id, failure)
            return None


def _read_here(run_id: str, failure: Exception) -> None:
    log.warning(
        "reading in this process instead",
        extra={"event": "read_ahead_failed", "run_id": run_id, "detail": str(failure)[:2000]},
    )


def _import_ledger(
    run: Run,
    path: Path,
    limits: Limits,
    now: dt.datetime,
    progress: Progress | None,
    batch_size: int,
    ahead: _Ahead | None = None,
) -> tuple[LedgerCursor, list[FindingRecord], bool]:
    """Store the ledger's new lines batch by batch; returns the cursor, the findings about
    the ledger file itself (a FIFO or symlink in its place), which are re-checked on every
    import like the other files' findings, and whether the ledger was read from its first
    byte (then the cursor's sets of calls are the whole ledger's, else the new lines').

    ``ahead``: when there is enough to read, a child reads the ledger from the same cursor
    while this process stores (``_Ahead.start``). When it fails, the batches it gave stay
    stored, each whole with its cursor, and the rest is read here, as the next import would
    after a killed one."""
    cursor = _cursor_of(run)
    whole = run.ledger_offset == 0
    file_findings: list[FindingRecord] = []
    postgres = _is_postgres()
    try:
        ledger = os.lstat(path / protocol.LEDGER_NAME)
    except OSError:
        ledger = None
    ledger_size = ledger.st_size if ledger else 0
    signature = signature_from(ledger) if ledger else ""
    if signature and signature == run.ledger_signature and not _ledger_has_file_findings(run):
        return cursor, file_findings, whole  # not a byte added or changed since it was read to its end
    signing_key = run_signing_key(path, signing_keys())
    child = ahead.start_ledger(path, cursor, limits, batch_size, signing_key, ledger_size) if ahead else None
    if child is not None:
        batches: Iterator[PreparedBatch] = child.batches()
    else:
        read = read_ledger(path, cursor, limits, batch_size, signing_key)
        batches = (read_ahead.prepare_batch(run.pk, batch, postgres) for batch in read)
    try:
        for batch in batches:
            with transaction.atomic():
                if batch.restarted:
                    whole = True
                    Event.objects.filter(run=run).delete()
                    run.findings.filter(scope=LEDGER, closed_at__isnull=True).update(closed_at=now)
                bulk_upsert(Event, EVENT_COLUMNS, batch.rows, conflict=("run_id", "seq"), update=False)
                stats.count_batch(run, batch.types, batch.minutes, restarted=batch.restarted)
                _store_findings(run, batch.findings, now)
                file_findings.extend(f for f in batch.findings if f.scope == FILES)
                cursor = batch.cursor
                Run.objects.filter(pk=run.pk).update(
                    **{column: getattr(cursor, field) for column, field in CURSOR_COLUMNS}
                )
            if progress is not None:
                progress(run.run_id, cursor.offset, ledger_size)
    except ReadAheadError as failure:
        _read_here(run.run_id, failure)
        run.refresh_from_db()
        cursor, rest_findings, rest_whole = _import_ledger(run, path, limits, now, progress, batch_size)
        return cursor, file_findings + rest_findings, rest_whole
    if child is not None:
        cursor = child.final_cursor  # the batches' cursors leave out the sets of calls
    # Taken before the read: a line appended meanwhile changes it, and is read next time.
    Run.objects.filter(pk=run.pk).update(ledger_signature=signature)
    return cursor, file_findings, whole


def _ledger_has_file_findings(run: Run) -> bool:
    """A ledger that could not be read as a file (its finding is re-checked by reading it)."""
    ledger_findings = run.findings.filter(closed_at__isnull=True, scope=FILES, subject__startswith=protocol.LEDGER_NAME)
    return ledger_findings.exists()


# --- everything else -------------------------------------------------------


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
    rows = read_ahead.record_rows(run.pk, records, _conversions(model, names), _is_postgres())
    _store_rows(run, model, ("run_id", *names), rows, key, present, among)


def _conversions(model: type[Model], names: Sequence[str]) -> list[tuple[str, str]]:
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
            for chunk in _chunks(sorted(among))
            for k in existing.filter(**{f"{key}__in": chunk}).values_list(key, flat=True)
        }
    for chunk in _chunks(sorted(stored - present)):
        existing.filter(**{f"{key}__in": chunk}).delete()


# What the reader and the recovery decisions read of a receipt they do not read again.
KNOWN_FIELDS = (
    "call_id", "file_signature", "file_sha256", "status", "tool", "error_kind", "queryable", "verification",
    "decision", "decision_reason",
)  # fmt: skip


def _known_receipts(run: Run, among: set[str] | None = None) -> dict[str, CallRecord]:
    """The records of the run's receipts as last imported (of the calls ``among``, or all), to
    hand the reader: a receipt whose file has not changed since is not read again, nor written back.

    Only what the reader's cross-checks and the recovery decisions read is loaded
    (times only for calls in doubt, which the stale check reads): the rest of a
    reused record is never used. A receipt whose file had findings of its own is
    left out, so that it is read, and its findings found, again.
    """
    reread = set(
        run.findings.filter(closed_at__isnull=True, call_id__gt="")
        .exclude(code__in=RECOMPUTED_EVERY_READ)
        .values_list("call_id", flat=True)
    )
    calls = Call.objects.filter(run=run, receipt_present=True).exclude(file_signature="")
    parts = [calls] if among is None else [calls.filter(call_id__in=chunk) for chunk in _chunks(sorted(among))]
    # A hundred thousand records: made from a dict of defaults, not through the dataclass's
    # twenty-five-argument __init__, which costs more than the query that reads them.
    defaults = vars(CallRecord(call_id=""))
    known = {}
    for row in (row for part in parts for row in part.values_list(*KNOWN_FIELDS).iterator(10_000)):
        if row[0] not in reread:
            record = object.__new__(CallRecord)
            record.__dict__ = defaults | dict(zip(KNOWN_FIELDS, row, strict=True))
            known[row[0]] = record
    # Their times, for the stale_call check of an open receipt.
    open_calls = [call_id for call_id, record in known.items() if record.status in protocol.OPEN_STATUSES]
    for chunk in _chunks(open_calls):
        times = calls.filter(call_id__in=chunk).values_list("call_id", "created_at", "updated_at")
        for call_id, created_at, updated_at in times:
            known[call_id].created_at, known[call_id].updated_at = created_at, updated_at
    return known


def _judgement(call: CallRecord) -> tuple[str, str, str, bool]:
    """What may change for a receipt that is not read again: the ledger or a confirmation judge it anew."""
    return call.verification, call.decision, call.decision_reason, call.queryable


CALL_FIELDS = tuple(field.name for field in dataclasses.fields(CallRecord))


def _store_files(
    run: Run,
    files: RunFiles,
    judged_before: dict[str, tuple[str, str, str, bool]],
    among: set[str] | None,
    prepared: PreparedFiles | None = None,
) -> None:
    if prepared is not None:  # read by the child: every receipt read, none reused, the rows made
        _store_rows(run, Call, ("run_id", *CALL_FIELDS), prepared.call_rows, "call_id", prepared.call_ids, among)
    # A reused record is written back only when its judgement changed (a confirmation, a refused reuse).
    kept = frozenset(files.reused_calls)
    if prepared is None:
        _store_records(run, Call, files.calls, "call_id", kept, among)
    for call in files.calls:
        if call.call_id in kept and judged_before.get(call.call_id) != _judgement(call):
            Call.objects.filter(run=run, call_id=call.call_id).update(
                verification=call.verification,
                decision=call.decision,
                decision_reason=call.decision_reason,
                queryable=call.queryable,
            )
    _store_records(run, Submission, files.submissions, "client_submission_id")
    _store_records(run, Confirmation, files.confirmations, "call_id")


# --- entry points ----------------------------------------------------------


def _report(run: Run, changed: bool) -> RunReport:
    summary = stats.RunSummary.of(run)
    return RunReport(
        run_id=run.run_id,
        calls=summary.calls,
        events=run.event_count,
        submissions=summary.submissions,
        findings=open_findings_of(run),
        changed=changed,
    )


def run_import(
    *,
    path: Path,
    limits: Limits = DEFAULT_LIMITS,
    now: dt.datetime | None = None,
    force: bool = False,
    progress: Progress | None = None,
    batch_size: int = BATCH_EVENTS,
    listing: Listing | None = None,
    host: Host | None = None,
) -> RunReport:
    """Import one run directory (its name is the run_id), as ``host``'s (this process's by default).

    ``listing``: the run's fingerprint and receipt signatures, when the caller has
    just taken them (a run root's pass does), so that a hundred thousand files are
    not listed twice. Taken before the lock, it can only be older than the files:
    a change it misses makes the next fingerprint differ.

    Never raises for what is in the directory: a failure nobody foresaw rolls
    back the transaction it happened in, becomes an ``import_failed`` finding on
    the run, and the run is read again on the next import.
    """
    path = Path(path).absolute()
    now = now or protocol.utc_now()
    run_id = path.name
    host = host or hosts.current()
    with run_import_lock(run_id):
        # Who owns the run is decided here, under the run's lock: the first host to import it.
        # The pass's own check (``_claimed_elsewhere``) read the owners before taking it, and
        # another host may have created the run since.
        run, _ = Run.objects.select_related("host").get_or_create(
            run_id=run_id, defaults={"path": str(path), "host": host}
        )
        if run.host_id is None:  # imported before hosts were recorded: this host's
            Run.objects.filter(pk=run.pk).update(host=host)
            run.host = host
        elif run.host_id != host.pk:
            raise ClaimedElsewhereError(f"{run.path} on host {run.host}")
        if run.archived:
            raise ClaimedElsewhereError(f"the run archived as {run.archive_path or run.path}")
        try:
            listing = listing or Listing.of(path)
            report = _import_run_locked(run, path, limits, now, force, progress, batch_size, listing)
        except Exception as error:  # noqa: BLE001 - one run's surprise must not stop the others
            detail = Sentence("import_failed.error", error=f"{type(error).__name__}: {error}"[:2000])
            with transaction.atomic():
                _store_findings(run, [FindingRecord("import_failed", "import", detail)], now)
                stats.refresh_run_summary(run)
            # Ledger batches committed before the failure stay: each is whole with its cursor.
            run.refresh_from_db()
            report = _report(run, changed=True)
            report.failed = True
            log.error("run import failed", extra={"event": "import_failed", "run_id": run_id, "detail": detail})
            return report
        if report.changed:
            log.info(
                "run imported",
                extra={"event": "run_imported", "run_id": run_id, "events": report.events, "calls": report.calls,
                       "open_findings": len(report.findings)},
            )  # fmt: skip
        return report


class ClaimedElsewhereError(Exception):
    """The run_id is another host's run, or an archived run's: this directory is not imported."""


def signing_keys() -> dict[str, protocol.SigningKey]:
    """The keys the importer checks signed runs with (``EVIDENCE_SIGNING_KEY_FILES``), by id.

    Read again when the setting changes. Receipts read before a key was added are
    not read again for it: import with ``--force`` after changing the keys.
    """
    return _load_signing_keys(tuple(settings.EVIDENCE_SIGNING_KEY_FILES))


@functools.cache
def _load_signing_keys(paths: tuple[str, ...]) -> dict[str, protocol.SigningKey]:
    return signing.load_keys(list(paths))


def _import_run_locked(
    run: Run,
    path: Path,
    limits: Limits,
    now: dt.datetime,
    force: bool,
    progress: Progress | None,
    batch_size: int,
    listing: Listing,
) -> RunReport:
    if not force and _Known.of(run).unchanged(path, now, listing):
        return _report(run, changed=False)
    events_before = run.event_count
    decided = pending_decisions(run)
    file_arguments: dict[str, Any] = {
        "limits": limits,
        "now": now,
        "known_contract": run.contract_sha256,
        "listed_signatures": listing.receipt_signatures,
        "keys": signing_keys(),
        "require_signed": settings.EVIDENCE_SIGNED_RUNS_ONLY,
    }
    # The child reads the other files too when this import would read them all, none known:
    # a ledger read from its first byte (so no scope), and no receipt stored to reuse.
    whole_and_new = run.ledger_offset == 0 and (force or not Call.objects.filter(run=run).exists())
    with contextlib.ExitStack() as stack:
        ahead = None
        if settings.EVIDENCE_IMPORT_READ_AHEAD:
            ahead = _Ahead(stack, run, {"run_dir": path, **file_arguments} if whole_and_new else None, decided)
            ahead.start_files(len(listing.receipt_signatures))
        cursor, ledger_file_findings, whole_ledger = _import_ledger(run, path, limits, now, progress, batch_size, ahead)
        # Read against the whole ledger, as here; a ledger read only in part (a child that
        # failed halfway) gives a cursor of the new lines only: then the files are read here.
        prepared = ahead.prepared_files(cursor) if ahead is not None and whole_ledger else None
    buckets = receipt_buckets(listing.receipt_signatures)
    scope = None if force or whole_ledger else _Scope.of(run, listing, buckets, cursor.call_ids, decided)
    known: dict[str, CallRecord] = {}
    if prepared is not None:
        files = prepared.files
    while prepared is None:
        if not whole_ledger:  # the sets name the new lines' calls only: those of the stored ledger
            _ledger_calls(run, cursor, None if scope is None else scope.calls)
        known = {} if force else _known_receipts(run, None if scope is None else scope.calls)
        files = read_run_files(
            path, ledger=cursor, known_receipts=known, receipt_names=None if scope is None else scope.receipt_names,
            **file_arguments,
        )  # fmt: skip
        if not files.contract_changed:
            break
        scope = None  # every receipt's identity depends on the contract: all of them, again
    # Before the decisions: a reused record is the known one, which they change.
    judged_before = {call_id: _judgement(record) for call_id, record in known.items()}
    if prepared is None:  # the child applied them
        apply_decisions(files, decided=decided)
    with transaction.atomic():
        _store_files(run, files, judged_before, None if scope is None else scope.calls, prepared)
        seen = _store_findings(run, ledger_file_findings + files.findings, now)
        # Ledger findings were stored batch by batch; re-check only what this pass re-checked.
        _close_findings_not_seen(
            run.findings.filter(scope=FILES), seen, now, None if scope is None else scope.rechecked
        )
        Run.objects.filter(pk=run.pk).update(
            path=str(path),
            state=files.state,
            finished=protocol.run_is_finished(files.state),
            attempts=files.attempts,
            contract_sha256=files.contract_sha256,
            steer_sha256=birth_digest(path),
            fingerprint=listing.fingerprint,
            receipt_buckets=buckets,
            next_stale_at=files.next_stale_at,
            event_count=sum(run.event_type_counts.values()),  # counted batch by batch
            imported_at=now,
        )
        stats.refresh_run_summary(run)
    run.refresh_from_db()
    calls_read = len(prepared.call_rows) if prepared is not None else len(files.calls) - len(files.reused_calls)
    refresh_planner_statistics({Event: run.event_count - events_before, Call: calls_read})
    if run.bodies_stripped_at is not None:
        # Retention stripped this run's bodies: what was read again is stripped again.
        from evidence.retention.actions import strip_bodies

        strip_bodies(run=run, now=now)
    return _report(run, changed=True)


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
    if not _is_postgres():
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


def _reuses_archived_id(path: Path, archived_birth: str, archived_at: dt.datetime | None) -> Sentence | str:
    """Why the directory at ``path`` is not what is left of the archived run of its name, or ""
    when it may be (its steer.json is the archived run's, or the archived run's is not known)."""
    if not archived_birth or birth_digest(path) == archived_birth:
        return ""
    if archived_at is None:
        return Sentence("archived_run_id_reused.some_time", run_id=path.name)
    return Sentence("archived_run_id_reused.at", run_id=path.name, archived_at=protocol.format_time(archived_at))


def _claimed_elsewhere(path: Path, recorded: str | None, owner: str | None, host: Host) -> str | None:
    """The other copy of this run_id, when one is imported: on another host, or in another
    runs root of this one and still there.

    Two directories with one run_id would overwrite each other's rows (and look
    like a rewritten ledger): the second is refused. A run that moved on its host
    (its old directory is gone) is the same run, and is followed.
    """
    if owner is not None and owner != host.name:
        return f"{recorded} on host {owner}"
    if recorded is None or recorded == str(path):
        return None
    return recorded if looks_like_run(Path(recorded)) else None


@dataclasses.dataclass
class Listing:
    """A run directory's fingerprint, its receipts' signatures and its confirmations' names,
    taken in one pass."""

    fingerprint: str
    receipt_signatures: dict[str, str]
    confirmation_names: set[str] = dataclasses.field(default_factory=set)

    @classmethod
    def of(cls, path: Path) -> Listing:
        signatures: dict[str, str] = {}
        confirmations: set[str] = set()
        return cls(run_fingerprint(path, signatures, confirmations), signatures, confirmations)


# --- what a re-import looks at -----------------------------------------------

# Above this share of the receipts (and this many calls), a re-import reads them all: it costs
# what reading some would. Below the floor it reads some, so every run exercises the one way.
SCOPED_READ_AT_MOST = 0.25
SCOPED_READ_FLOOR = 1_000


def _call_id_of(name: str) -> str:
    return name.removesuffix(".json")


def _bucket_of(call_id: str) -> str:
    bucket = call_id[:2]
    try:
        bucket.encode("utf-8")
    except UnicodeEncodeError:
        return "\ufffd"  # a name that is not UTF-8 never names a call: a bucket of their own, kept as text
    return bucket


def receipt_buckets(signatures: dict[str, str]) -> dict[str, str]:
    """The names and signatures of ``receipts/`` as one digest per bucket (the call ids' first two
    characters: call ids are hex digests, so a hundred thousand make 256 buckets of some 400).

    Kept with the run: a re-import compares them, and looks only at the buckets that differ,
    instead of loading every known receipt to find the one that changed.
    """
    lines: dict[str, list[str]] = {}
    for name, signature in signatures.items():
        lines.setdefault(_bucket_of(_call_id_of(name)), []).append(f"{name}\0{signature}")
    return {bucket: hashlib.sha256("\n".join(sorted(found)).encode("utf-8", "surrogateescape")).hexdigest()
            for bucket, found in lines.items()}  # fmt: skip


@dataclasses.dataclass
class _Scope:
    """The calls a re-import reads and checks again, when not all of them need it: those whose
    receipt bucket changed (files added, replaced or removed), those the ledger's new lines
    name, the calls still open (the clock can make them stale), those with a confirmation file
    or a decision waiting for this host. The rest were checked before against a ledger that
    said nothing new of them, and nothing they depend on has changed."""

    calls: set[str]
    receipt_names: set[str]

    @classmethod
    def of(
        cls, run: Run, listing: Listing, buckets: dict[str, str], named_by_new_lines: set[str], decided: dict
    ) -> _Scope | None:
        before = run.receipt_buckets
        if not before:
            return None  # imported before buckets were kept: read whole once
        changed = {bucket for bucket in buckets.keys() | before.keys() if buckets.get(bucket) != before.get(bucket)}
        names = {name for name in listing.receipt_signatures if _bucket_of(_call_id_of(name)) in changed}
        calls = {_call_id_of(name) for name in names} | named_by_new_lines | set(decided)
        calls |= {_call_id_of(name) for name in listing.confirmation_names}
        stored = Call.objects.filter(run=run)
        for bucket in sorted(changed):  # removed files: their rows, in the bucket's range of call ids
            calls.update(stored.filter(**_bucket_range(bucket)).values_list("call_id", flat=True))
        calls.update(stored.filter(status__in=protocol.OPEN_STATUSES).values_list("call_id", flat=True))
        if len(calls) > max(SCOPED_READ_FLOOR, SCOPED_READ_AT_MOST * len(listing.receipt_signatures)):
            return None
        names |= {f"{call_id}.json" for call_id in calls} & listing.receipt_signatures.keys()
        return cls(calls, names)

    def rechecked(self, call_id: str, subject: str) -> bool:
        """Whether a finding was looked for again: about a call in scope, a receipt file read,
        or any other file but a receipt (those are read whole every time)."""
        if call_id:
            return call_id in self.calls
        folder, _, name = subject.partition("/")
        return folder != "receipts" or name in self.receipt_names


def _bucket_range(bucket: str) -> dict[str, str]:
    """The call ids that start with ``bucket``, as a range the (run, call_id) index serves."""
    following = bucket[:-1] + chr(min(ord(bucket[-1]) + 1, 0x10FFFF))
    return {"call_id__gte": bucket, "call_id__lt": following}


@dataclasses.dataclass
class _Known:
    """What the last import recorded of a run: enough to tell that nothing changed."""

    path: str
    fingerprint: str
    next_stale_at: dt.datetime | None
    archived: bool
    summarised: bool

    @classmethod
    def of(cls, run: Run) -> _Known:
        return cls(run.path, run.fingerprint, run.next_stale_at, run.archived, run.summary is not None)

    def may_be_unchanged(self, path: Path, now: dt.datetime) -> bool:
        """Whether only the files' fingerprint can tell: the same directory, summarised, and no
        call or reservation due to turn stale."""
        if self.path != str(path) or not self.summarised:
            return False
        return self.next_stale_at is None or now < self.next_stale_at

    def unchanged(self, path: Path, now: dt.datetime, listing: Listing) -> bool:
        """Nothing to read: the one rule, for a root's pass and for the import under the lock."""
        return self.may_be_unchanged(path, now) and listing.fingerprint == self.fingerprint


@dataclasses.dataclass
class Watch:
    """What a watch carries from one pass to the next (``root_import``'s ``watch``).

    ``mine``: the listed names already found in the database as this host's runs at these
    paths. A pass looks up only the names it has not found so (a new directory, a copy another
    host owns): looking 20,000 names up every pass would cost more than the hot runs. Forgotten
    every ``cold_sweep``, so that a run deleted from the database is found again.
    """

    cold_sweep: dt.timedelta
    mine: set[str] = dataclasses.field(default_factory=set)
    found_at: dt.datetime | None = None

    @classmethod
    def from_settings(cls) -> Watch:
        return cls(cold_sweep=dt.timedelta(seconds=settings.EVIDENCE_COLD_SWEEP_SECONDS))

    def to_check(self, base: Path, names: list[str], host: Host, now: dt.datetime) -> set[str]:
        """The runs listed under ``base`` that this pass checks: the hot set, the cold runs due,
        and every name not found as this host's run at this path. No other run is touched."""
        if self.found_at is None or now - self.found_at >= self.cold_sweep:
            self.mine, self.found_at = set(), now
        listed = set(names)
        runs = Run.objects.filter(Q(host=host) | Q(host__isnull=True))
        new = sorted(listed - self.mine)
        for start in range(0, len(new), 500):
            rows = runs.filter(run_id__in=new[start : start + 500]).values_list("run_id", "path")
            self.mine.update(run_id for run_id, path in rows if path == os.path.join(base, run_id))
        self.mine &= listed
        # Two queries, not one with both: SQLite walks the indexes of an OR's branches only when
        # each branch is a range of its own, and unordered, or it reads the run_id index whole.
        due = {*runs.hot(now).order_by().values_list("run_id", flat=True)}
        due.update(runs.cold_due(now, self.cold_sweep).order_by().values_list("run_id", flat=True))
        return (listed - self.mine) | (due & listed)


def root_import(
    *,
    root: Path,
    limits: Limits = DEFAULT_LIMITS,
    now: dt.datetime | None = None,
    force: bool = False,
    progress: Progress | None = None,
    report_unchanged: bool = True,
    host: Host | None = None,
    watch: Watch | None = None,
) -> ImportReport:
    """Import every run directory under ``root`` (or ``root`` itself when it is one), as
    ``host``'s (this process's by default): a run another host imported is not imported here.

    One bad run never stops the others: its problems are findings on it. What the
    last import recorded of every run is read in one query, so a run whose files
    have not changed costs its ``stat`` calls and nothing else; without
    ``report_unchanged`` (the watch) it is not even reported.

    With ``watch`` only the runs ``Watch.to_check`` chooses are checked (and reported): the
    hot set, the cold runs due, and new directories; the others cost one entry of the root's
    listing. Every run checked is stamped checked (and changed, when its files were), and is
    found abandoned, or no longer, by ``models.is_abandoned``.
    """
    now = now or protocol.utc_now()
    host = host or hosts.current()
    discovery = discover_runs(Path(root))
    root_key = storable_text(str(Path(root).absolute()))
    base, names = discovery.base.absolute(), discovery.names
    if watch is not None:
        chosen = watch.to_check(base, names, host, now)
        names = [name for name in names if name in chosen]
    fields = ("run_id", "path", "fingerprint", "next_stale_at", "archived", "summary", "host__name", "steer_sha256",
              "archived_at", *ACTIVITY)  # fmt: skip
    rows = [
        row
        for start in range(0, len(names), 500)
        for row in Run.objects.filter(run_id__in=names[start : start + 500]).values_list(*fields)
    ]
    known = {row[0]: _Known(row[1], row[2], row[3], row[4], row[5] is not None) for row in rows}
    owners = {row[0]: row[6] for row in rows}
    births = {row[0]: (row[7], row[8]) for row in rows}
    activity = {row[0]: row[9:] for row in rows}
    changed: list[tuple[Path, Listing | None]] = []
    unchanged: list[str] = []
    root_problems = list(discovery.findings)
    for path in (base / name for name in names):
        recorded = known.get(path.name)
        if recorded is not None and recorded.archived:
            # An archived run is never brought back; retention removes what is left of it. A
            # directory holding another run under its id is said, and nothing removes it.
            reused = _reuses_archived_id(path, *births[path.name])
            if reused:
                root_problems.append(FindingRecord("archived_run_id_reused", path.name, reused))
            continue
        other = _claimed_elsewhere(path, recorded.path if recorded else None, owners.get(path.name), host)
        if other is not None:
            detail = Sentence("duplicate_run_id.elsewhere", run_id=path.name, other=other)
            root_problems.append(FindingRecord("duplicate_run_id", path.name, detail))
        elif force or recorded is None or not recorded.may_be_unchanged(path, now):
            changed.append((path, None))
        elif recorded.unchanged(path, now, listing := Listing.of(path)):
            unchanged.append(path.name)
        else:
            changed.append((path, listing))
    reports = []
    for path, listed in changed:
        try:
            reports.append(run_import(path=path, limits=limits, now=now, force=force, progress=progress,
                                      listing=listed, host=host))  # fmt: skip
        except ClaimedElsewhereError as claimed:
            detail = Sentence("duplicate_run_id.elsewhere", run_id=path.name, other=claimed)
            root_problems.append(FindingRecord("duplicate_run_id", path.name, detail))
    with transaction.atomic():  # after the imports: some are found under the runs' own locks
        seen = _store_findings(None, root_problems, now, root=root_key)
        _close_findings_not_seen(Finding.objects.filter(run__isnull=True, root=root_key), seen, now)
    _stamp_checked(reports, unchanged, known, activity, now)
    if report_unchanged:
        reports += [_report(run, changed=False) for run in Run.objects.filter(run_id__in=unchanged)]
        reports.sort(key=lambda report: report.run_id)
    root_findings = [
        {"code": f.code, "subject": f.subject, "detail": f.detail}
        for f in Finding.objects.filter(run__isnull=True, root=root_key, closed_at__isnull=True)
    ]
    return ImportReport(reports, root_findings)


# What ``models.is_abandoned`` reads of a run, and the stamp it leaves.
ACTIVITY = ("id", "state", "last_event_at", "changed_at", "abandoned_at")


def _stamp_checked(
    reports: list[RunReport], unchanged: list[str], known: dict[str, _Known], activity: dict, now: dt.datetime
) -> None:
    """After a pass: the runs it checked are stamped checked, those whose files changed (or whose
    import failed, to be read again while hot) changed, and each is judged abandoned or not: an
    unchanged run from what the pass read of it already, an imported one from its rows now."""
    imported = [report.run_id for report in reports]
    failed = {report.run_id for report in reports if report.failed}
    judged = [activity[run_id] for run_id in unchanged]
    changed = []
    for start in range(0, len(imported), 500):
        rows = Run.objects.filter(run_id__in=imported[start : start + 500]).values_list(
            "run_id", "fingerprint", *ACTIVITY
        )
        for run_id, fingerprint, pk, state, last_event_at, changed_at, abandoned_at in rows:
            recorded = known.get(run_id)
            if run_id in failed or recorded is None or recorded.fingerprint != fingerprint:
                changed.append(run_id)
                changed_at = now
            judged.append((pk, state, last_event_at, changed_at, abandoned_at))
    checked = imported + unchanged
    for start in range(0, len(checked), 500):
        Run.objects.filter(run_id__in=checked[start : start + 500]).update(checked_at=now)
    for start in range(0, len(changed), 500):
        Run.objects.filter(run_id__in=changed[start : start + 500]).update(changed_at=now)
    _judge_abandoned(judged, now)


ABANDONED_SUBJECT = "activity"


def _judge_abandoned(rows: list[tuple], now: dt.datetime) -> None:
    """Open the run_abandoned finding of each run that ``models.is_abandoned`` says is (it then
    leaves the hot set), and close it for each that wrote again or finished. ``rows``: each
    run's ``ACTIVITY``."""
    after = dt.timedelta(seconds=settings.EVIDENCE_ABANDONED_AFTER_SECONDS)
    for pk, state, last_event_at, changed_at, abandoned_at in rows:
        abandoned = models.is_abandoned(state, last_event_at or changed_at, now, after)
        if abandoned == (abandoned_at is not None):
            continue
        run = Run.objects.get(pk=pk)
        with transaction.atomic():
            if abandoned:
                since = protocol.human_time(last_event_at or changed_at)
                detail = Sentence(
                    "run_abandoned.silent",
                    state=repr(state or "none"),
                    since=since,
                    command="`python -m receipts state`",
                )
                _store_findings(
                    run, [FindingRecord("run_abandoned", ABANDONED_SUBJECT, detail, scope=ACTIVITY_SCOPE)], now
                )
            else:
                run.findings.filter(code="run_abandoned", closed_at__isnull=True).update(closed_at=now)
            Run.objects.filter(pk=pk).update(abandoned_at=now if abandoned else None)
            stats.refresh_run_summary(run)
        event = "run_abandoned" if abandoned else "run_resumed"
        log.info(event.replace("_", " "), extra={"event": event, "run_id": run.run_id})


def pending_decisions(run: Run) -> dict[str, tuple[str, str]]:
    """People's decisions about this run not yet written into it (their host delivers them),
    ``call_id -> (resolution, receipt_sha256)``: a re-import before the delivery follows them."""
    rows = HumanDecision.objects.filter(run=run, delivered_at__isnull=True, undeliverable="")
    return {call_id: (resolution, sha) for call_id, resolution, sha in
            rows.values_list("call_id", "resolution", "receipt_sha256")}  # fmt: skip
