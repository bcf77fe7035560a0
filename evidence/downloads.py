"""The rows of each list's CSV and JSON twin: columns named once, rows streamed in chunks.

Selectors for the download links: every function returns ``(columns, rows)``
where ``rows`` is an iterator, so a list of a million events never sits in memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from django.db.models import QuerySet

from evidence import selectors
from evidence.models import AuditEntry, Finding, HumanDecision, Run

Rows = tuple[Sequence[str], Iterator[Sequence[Any]]]

# Every column the runs table shows ("Active" as its two ends, the status bar as its counts).
RUN_COLUMNS = (
    "run_id",
    "state",
    "attempts",
    "first_event_at",
    "last_event_at",
    "events",
    "calls",
    "calls_by_status",
    "verdict",
    "in_doubt",
    "stale_reservations",
    "open_findings",
)
EVENT_COLUMNS = ("seq", "ts", "type", "call_id", "client_submission_id", "disposition", "payload")
CALL_COLUMNS = ("call_id", "status", "tool", "tool_version", "attempt", "verification", "decision", "updated_at")
SUBMISSION_COLUMNS = ("client_submission_id", "state", "task_id", "request_digest", "task_present", "updated_at")
DECISION_COLUMNS = ("call_id", "status", "tool", "decision", "decision_reason")
FINDING_FIELDS = (
    "run__run_id",
    "code",
    "severity",
    "subject",
    "detail",
    "stored_value",
    "recomputed_value",
    "first_seen",
)
FINDING_COLUMNS = ("run_id", *FINDING_FIELDS[1:])
STALE_COLUMNS = ("kind", "run_id", "subject", "state", "since", "task_present", "digests_match", "resume")
RUN_LISTS = ("events", "calls", "submissions")
CHUNK = 500


def runs_rows(runs: QuerySet[Run]) -> Rows:
    def rows() -> Iterator[Sequence[Any]]:
        for start in range(0, runs.count(), CHUNK):
            chunk = list(runs[start : start + CHUNK])
            summaries = selectors.run_summaries(runs=chunk)
            for run in chunk:
                summary = summaries[run.pk]
                yield (run.run_id, run.state, run.attempts, run.first_event_at, run.last_event_at, run.event_count,
                       summary.calls, summary.calls_by_status, summary.verdict, summary.in_doubt,
                       summary.stale_reservations, summary.open_findings)  # fmt: skip

    return RUN_COLUMNS, rows()


def run_rows(*, run: Run, which: str, event_type: str = "") -> Rows:
    """One of a run's lists (``events``, ``calls``, ``submissions``); events keep the type filter."""
    if which == "calls":
        return CALL_COLUMNS, selectors.run_calls(run=run).values_list(*CALL_COLUMNS).iterator()
    if which == "submissions":
        rows = selectors.run_submissions(run=run).values_list(*SUBMISSION_COLUMNS)
        return SUBMISSION_COLUMNS, rows.iterator()
    events = selectors.run_events(run=run, event_type=event_type).order_by("seq")
    return EVENT_COLUMNS, events.values_list(*EVENT_COLUMNS).iterator(chunk_size=5000)


def decision_rows(*, run: Run, decision: str = "") -> Rows:
    calls = selectors.calls_by_decision(run=run, decision=decision)
    return DECISION_COLUMNS, calls.values_list(*DECISION_COLUMNS).iterator()


def finding_rows(findings: QuerySet[Finding]) -> Rows:
    return FINDING_COLUMNS, findings.values_list(*FINDING_FIELDS).iterator()


def stale_rows(items: Iterable[selectors.StaleItem]) -> Rows:
    return STALE_COLUMNS, (tuple(getattr(item, column) for column in STALE_COLUMNS) for item in items)


DECISION_AUDIT_FIELDS = ("decided_at", "actor", "run__run_id", "call_id", "resolution", "reason", "receipt_sha256")
DECISION_AUDIT_COLUMNS = ("decided_at", "actor", "run_id", "call_id", "resolution", "reason", "receipt_sha256")


ACTION_AUDIT_FIELDS = ("at", "actor", "run__run_id", "action", "reason")
ACTION_AUDIT_COLUMNS = ("at", "actor", "run_id", "action", "reason")


def action_rows(entries: QuerySet[AuditEntry]) -> Rows:
    return ACTION_AUDIT_COLUMNS, entries.values_list(*ACTION_AUDIT_FIELDS).iterator()


def audit_rows(decisions: QuerySet[HumanDecision]) -> Rows:
    return DECISION_AUDIT_COLUMNS, decisions.values_list(*DECISION_AUDIT_FIELDS).iterator()


INBOX_COLUMNS = ("kind", "severity", "since", "run_id", "subject", "detail", "action", "code")


def inbox_rows(items: Iterable[Any]) -> Rows:
    return INBOX_COLUMNS, (tuple(getattr(item, column) for column in INBOX_COLUMNS) for item in items)


RETENTION_COLUMNS = ("run_id", "action", "reason", "blockers", "clock_from", "strip_on", "archive_on", "body_bytes")


def retention_rows(plans: Iterable[Any]) -> Rows:
    rows = (tuple(getattr(plan, column) for column in RETENTION_COLUMNS) for plan in plans)
    return RETENTION_COLUMNS, rows
