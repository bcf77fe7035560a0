"""Reading run directories: pure, standard library only, never raises on bad input.

Every check of the finding table in RUN_DIRECTORY.md is made here; the importer
only stores what comes back. A bad record becomes a finding and never hides the
good ones beside it. The package's rooms:

- ``safe_open``: size limits, and files read whole within them, each opened through
  ``receipts.confined`` in its read-only mode (directory fds, ``O_NOFOLLOW``, regular files only);
- ``discovery``: the runs in a runs root, and each run's fingerprint and glance;
- ``ledger``: the event ledger, streamed from a cursor in batches;
- ``records``: what the rest is read into, one record per receipt, submission and confirmation;
- ``checks``: ``RunContext``, one pass over a run's files: the run, its ledger cursor, limits and
  clock, the ``RunFiles`` kept and the findings made, and the helpers every reader shares;
- ``receipts``: ``ReceiptReader``, the receipts (their identity and status) and stale calls;
- ``confirmations``: the confirmations, each against the receipt it confirms;
- ``submissions``: the submission records and the task files they describe;
- ``spill``: batches of records set aside on disk until the ledger that judges them is known;
- ``files``: ``read_run_files``, the run as a whole: state, steer and the signed-run checks, then
  each reader above given the one context, then the cross-checks against the ledger (given a
  sink, a bounded batch of calls at a time);
- ``verify``: the offline check of an evidence export (not a run directory: its manifest and page).

No reader inherits from another: each takes the ``RunContext`` and adds to it.

Two entry points: ``read_ledger`` streams the ledger (so a re-import parses only
the appended lines), and ``read_run_files`` reads everything else once the
ledger's call ids are known. ``read_run`` does both at once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path

from receipts.protocol import SigningKey
from receipts.reader.discovery import (
    Discovery,
    Glance,
    RunParts,
    birth_digest,
    discover_runs,
    list_run,
    looks_like_run,
    receipt_bucket,
    relist_run,
    run_fingerprint,
    run_glance,
)
from receipts.reader.files import read_run_files, run_signing_key
from receipts.reader.ledger import BATCH_EVENTS, EventRecord, LedgerBatch, LedgerCursor, read_ledger
from receipts.reader.records import CallRecord, ConfirmationRecord, RunFiles, SubmissionRecord
from receipts.reader.safe_open import DEFAULT_LIMITS, MAX_JSON_BYTES, MAX_LINE_BYTES, Limits

__all__ = [
    "BATCH_EVENTS",
    "DEFAULT_LIMITS",
    "MAX_JSON_BYTES",
    "MAX_LINE_BYTES",
    "CallRecord",
    "ConfirmationRecord",
    "Discovery",
    "EventRecord",
    "Glance",
    "LedgerBatch",
    "LedgerCursor",
    "Limits",
    "RunFiles",
    "RunParts",
    "SubmissionRecord",
    "birth_digest",
    "discover_runs",
    "list_run",
    "looks_like_run",
    "read_ledger",
    "read_run",
    "read_run_files",
    "receipt_bucket",
    "relist_run",
    "run_fingerprint",
    "run_glance",
]


def read_run(
    run_dir: Path,
    *,
    limits: Limits = DEFAULT_LIMITS,
    now: dt.datetime | None = None,
    keep_events: bool = True,
    keys: Mapping[str, SigningKey] | None = None,
) -> tuple[RunFiles, list]:
    """A whole run at once: files and every ledger finding, and the events unless ``keep_events``
    is false (replay needs only the call ids the ledger names, not a million events in memory).
    ``keys``: signing keys by id; a signed run whose key is among them has every signature checked."""
    events, ledger_findings = [], []
    cursor = LedgerCursor()
    signing_key = run_signing_key(Path(run_dir), keys)
    for batch in read_ledger(Path(run_dir), None, limits, signing_key=signing_key):
        if keep_events:
            events.extend(batch.events)
        ledger_findings.extend(batch.findings)
        cursor = batch.cursor
    files = read_run_files(run_dir, ledger=cursor, limits=limits, now=now, keys=keys)
    files.findings = ledger_findings + files.findings
    return files, events
