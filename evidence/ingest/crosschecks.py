"""What are a run's files held against? What was stored, configured and decided before.

The reader checks the other files against the ledger: after a read of the ledger's new
lines only, it is handed the stored ledger's calls (``ledger_calls``) and the receipts it
need not read again (``known_receipts``). Signatures are checked with the configured keys
(``signing_keys``), and people's decisions not yet delivered are followed
(``pending_decisions``). A runs root's pass holds each directory against the rows of its
run_id: an archived run's id used again (``reuses_archived_id``), or the run imported from
another copy (``claimed_elsewhere``).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable
from pathlib import Path

from django.conf import settings

from evidence.ingest.storing import chunks
from evidence.models import Call, Event, Host, HumanDecision, Run
from receipts import protocol, signing
from receipts.findings import Sentence
from receipts.reader import CallRecord, LedgerCursor, birth_digest, looks_like_run

# --- what the reader is handed ---------------------------------------------

# Findings the reader makes again on every read from the records, reused or not.
# Findings the reader makes again for receipts it does not read again (from the ledger and the clock).
RECOMPUTED_EVERY_READ = (
    "stale_call",
    "orphan_receipt",
    "missing_receipt",
    "committed_event_missing",
    "receipt_contradicts_ledger",
    "effect_not_shown",
    "import_failed",
)


def ledger_calls(run: Run, cursor: LedgerCursor, among: set[str] | None) -> None:
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
        for chunk in chunks(sorted(among))
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


# What the reader and the recovery decisions read of a receipt they do not read again.
KNOWN_FIELDS = (
    "call_id", "file_signature", "file_sha256", "status", "tool", "error_kind", "queryable", "verification",
    "decision", "decision_reason",
)  # fmt: skip


def known_receipts(run: Run, among: set[str] | None = None) -> dict[str, CallRecord]:
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
    parts = [calls] if among is None else [calls.filter(call_id__in=chunk) for chunk in chunks(sorted(among))]
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
    for chunk in chunks(open_calls):
        times = calls.filter(call_id__in=chunk).values_list("call_id", "created_at", "updated_at")
        for call_id, created_at, updated_at in times:
            known[call_id].created_at, known[call_id].updated_at = created_at, updated_at
    return known


def signing_keys() -> dict[str, protocol.SigningKey]:
    """The keys the importer checks signed runs with (``EVIDENCE_SIGNING_KEY_FILES``), by id.

    Read again when the setting changes. Receipts read before a key was added are
    not read again for it: import with ``--force`` after changing the keys.
    """
    return _load_signing_keys(tuple(settings.EVIDENCE_SIGNING_KEY_FILES))


@functools.cache
def _load_signing_keys(paths: tuple[str, ...]) -> dict[str, protocol.SigningKey]:
    return signing.load_keys(list(paths))


def pending_decisions(run: Run) -> dict[str, tuple[str, str]]:
    """People's decisions about this run not yet written into it (their host delivers them),
    ``call_id -> (resolution, receipt_sha256)``: a re-import before the delivery follows them."""
    rows = HumanDecision.objects.filter(run=run, delivered_at__isnull=True, undeliverable="")
    return {call_id: (resolution, sha) for call_id, resolution, sha in
            rows.values_list("call_id", "resolution", "receipt_sha256")}  # fmt: skip


# --- what a runs root's pass holds a directory against ---------------------


def reuses_archived_id(path: Path, archived_birth: str, archived_at: dt.datetime | None) -> Sentence | str:
    """Why the directory at ``path`` is not what is left of the archived run of its name, or ""
    when it may be (its steer.json is the archived run's, or the archived run's is not known)."""
    if not archived_birth or birth_digest(path) == archived_birth:
        return ""
    if archived_at is None:
        return Sentence("archived_run_id_reused.some_time", run_id=path.name)
    return Sentence("archived_run_id_reused.at", run_id=path.name, archived_at=protocol.format_time(archived_at))


def claimed_elsewhere(path: Path, recorded: str | None, owner: str | None, host: Host) -> str | None:
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
