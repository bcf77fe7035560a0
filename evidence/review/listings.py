"""Every list the dashboard shows, defined once: its rows in order, and the fields of an item.

A ``Listing`` is the list's segments (querysets on an index, each in its key
order: ``evidence.lib.pagination``) and what one item of it says, field by field.
The page shows one keyset page of it; its CSV and JSON twins stream every item
with those fields, by key, never the whole list in memory; the API answers one
page of the same items. So a twin and the API give the same list in the same
shape: ``{"items": [{field: value, ...}], "next": cursor or null, "total": n or
null}`` (a twin holds every item, and no ``next``), and a CSV has one column a
field.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from evidence.lib import hosts as host_facts
from evidence.lib.pagination import Segment, every_row
from evidence.lib.stats import RunSummary
from evidence.models import Call, Host, Run
from evidence.retention import plans
from evidence.review import inbox as inbox_items
from evidence.review import selectors, triage
from receipts import protocol


def json_value(value: Any) -> Any:
    """A field's value as the twins and the API give it: a time in ISO 8601 to the microsecond,
    UTC as ``Z``."""
    if isinstance(value, dt.datetime):
        return value.isoformat().replace("+00:00", "Z")
    return value


@dataclasses.dataclass(frozen=True)
class Listing:
    name: str  # what the twins are called
    fields: tuple[str, ...]
    segments: list[Segment]
    values: Callable[[Any], Sequence[Any]]  # one item's values, in the order of ``fields``
    total: int | None = None  # the whole list's length, when it is known without counting

    def item(self, row: Any) -> dict[str, Any]:
        """One item as JSON gives it (a twin, the API)."""
        return {field: json_value(value) for field, value in zip(self.fields, self.values(row), strict=True)}

    def items(self) -> Iterator[dict[str, Any]]:
        return (self.item(row) for row in every_row(self.segments))

    def rows(self) -> Iterator[Sequence[Any]]:
        return (self.values(row) for row in every_row(self.segments))


# --- runs -----------------------------------------------------------------------


RUN_FIELDS = (
    "run_id", "state", "attempts", "verdict", "first_event_at", "last_event_at", "events", "calls",
    "calls_by_status", "in_doubt", "stale_reservations", "open_findings", "archived", "legal_hold",
)  # fmt: skip


def _with_summaries(runs: list[Run]) -> list[tuple[Run, RunSummary]]:
    return [(run, RunSummary.of(run)) for run in runs]


def _run_values(row: tuple[Run, RunSummary]) -> Sequence[Any]:
    run, summary = row
    return (run.run_id, run.state, run.attempts, summary.verdict, run.first_event_at, run.last_event_at,
            run.event_count, summary.calls, summary.calls_by_status, summary.in_doubt, summary.stale_reservations,
            summary.open_findings, run.archived, run.legal_hold)  # fmt: skip


def run_item(run: Run) -> dict[str, Any]:
    """One run as an item of the runs list (the API's run)."""
    return {
        field: json_value(value)
        for field, value in zip(RUN_FIELDS, _run_values((run, RunSummary.of(run))), strict=True)
    }


def runs(*, state: str = "", attention: bool = False) -> Listing:
    """Runs, the most recent activity first; those with no event yet at the end."""
    rows = selectors.runs_list(state=state, attention=attention)
    segments = [
        Segment(rows.filter(last_event_at__isnull=False), ("-last_event_at", "-run_id"), _with_summaries),
        Segment(rows.filter(last_event_at__isnull=True), ("run_id",), _with_summaries),
    ]
    return Listing("runs", RUN_FIELDS, segments, _run_values)


# --- one run's lists ---------------------------------------------------------------

EVENT_FIELDS = ("seq", "ts", "type", "call_id", "client_submission_id", "disposition", "payload")
CALL_FIELDS = (
    "call_id", "status", "written_status", "tool", "tool_version", "attempt", "verification", "decision",
    "decision_reason", "created_at", "updated_at", "settled_by", "settled_on_host",
)  # fmt: skip
SUBMISSION_FIELDS = ("client_submission_id", "state", "task_id", "request_digest", "task_present", "updated_at")
DECISION_FIELDS = ("call_id", "status", "tool", "decision", "decision_reason")
RUN_LISTS = ("events", "calls", "submissions")


def _fields_of(fields: Sequence[str]) -> Callable[[Any], Sequence[Any]]:
    return lambda row: tuple(getattr(row, field) for field in fields)


def events(*, run: Run, event_type: str = "") -> Listing:
    """The ledger in its order, oldest first, as a chain is checked (the run page shows the
    same events newest first: ``newest_first``)."""
    segment = Segment(selectors.run_events(run=run, event_type=event_type), ("seq",))
    total = run.event_type_counts.get(event_type, 0) if event_type else run.event_count
    return Listing(f"{run.run_id}-events", EVENT_FIELDS, [segment], _fields_of(EVENT_FIELDS), total)


def newest_first(ledger: Listing) -> list[Segment]:
    """The ledger's segments the other way round, as the run page pages them."""
    return [Segment(segment.rows, ("-seq",)) for segment in ledger.segments]


def _call_values(call: Call) -> Sequence[Any]:
    # "status" as a page shows it (``recovery.shown_status``): a receipt that fails its identity
    # check is never "committed", a call a person settled is "settled: ...", by ``settled_by``;
    # ``settled_on_host`` names the host when that name is the host's word, not a dashboard account.
    return (call.call_id, call.shown_status, call.status, call.tool, call.tool_version, call.attempt,
            call.verification, call.decision, call.decision_reason, call.created_at, call.updated_at,
            getattr(call, "settled_by", "") if call.settled else "",
            getattr(call, "settled_on_host", "") if call.settled else "")  # fmt: skip


def calls(*, run: Run) -> Listing:
    segment = Segment(selectors.run_calls(run=run), ("call_id",))
    return Listing(f"{run.run_id}-calls", CALL_FIELDS, [segment], _call_values, RunSummary.of(run).calls)


def submissions(*, run: Run, client_submission_id: str = "") -> Listing:
    rows = selectors.run_submissions(run=run, client_submission_id=client_submission_id)
    total = None if client_submission_id else RunSummary.of(run).submissions
    return Listing(
        f"{run.run_id}-submissions", SUBMISSION_FIELDS, [Segment(rows, ("client_submission_id",))],
        _fields_of(SUBMISSION_FIELDS), total,
    )  # fmt: skip


def decisions(*, run: Run, decision: str = "") -> Listing:
    """The run's calls by recovery decision, most urgent first, each decision by call_id."""
    segments = [Segment(rows, ("call_id",)) for rows in selectors.decision_segments(run=run, decision=decision)]
    counts = dict(selectors.decision_counts(run=run))
    total = counts.get(decision, 0) if decision else sum(counts.values())
    values = lambda call: (call.call_id, call.shown_status, call.tool, call.decision, call.decision_reason)  # noqa: E731
    return Listing(f"{run.run_id}-replay", DECISION_FIELDS, segments, values, total)


# --- across runs ---------------------------------------------------------------------

# A finding's triage, in every list of findings (the inbox's, the stale one): its state ("" when
# open), who, when, why, and until when (or until it changes).
TRIAGE_FIELDS = triage.FIELDS


FINDING_FIELDS = (
    "run_id", "code", "severity", "subject", "detail", "call_id", "stored_value", "recomputed_value", "first_seen",
    "finding_id", *TRIAGE_FIELDS,
)  # fmt: skip


def _finding_values(finding: Any) -> Sequence[Any]:
    return (finding.run.run_id if finding.run else None, finding.code, finding.severity, finding.subject,
            finding.detail, finding.call_id, finding.stored_value, finding.recomputed_value,
            finding.first_seen, finding.pk, *(getattr(finding, name) for name in TRIAGE_FIELDS))  # fmt: skip


def findings(
    *, code: str = "", run_id: str = "", severity: str = "", view: str = triage.OPEN, now: dt.datetime | None = None
) -> Listing:
    """Open findings: the digest mismatches (evidence that something was altered), then the rest;
    of ``view`` (not triaged, acknowledged or snoozed)."""
    now = now or protocol.utc_now()
    digest, other = selectors.open_findings(code=code, run_id=run_id, severity=severity, view=view, now=now)
    present = functools.partial(triage.as_shown, now=now)
    segments = [Segment(digest, ("code", "id"), present), Segment(other, ("code", "id"), present)]
    return Listing("findings", FINDING_FIELDS, segments, _finding_values)


STALE_FIELDS = (
    "kind", "run_id", "subject", "state", "since", "task_present", "digests_match", "resume", "finding_id",
    *TRIAGE_FIELDS,
)  # fmt: skip


def stale(*, view: str = triage.OPEN, now: dt.datetime | None = None) -> Listing:
    """Stale reservations and calls, in the order they went stale; of ``view``."""
    now = now or protocol.utc_now()
    present = functools.partial(selectors.stale_items, now=now)
    segment = Segment(selectors.stale_findings(view=view, now=now), ("first_seen", "id"), present)
    return Listing("stale", STALE_FIELDS, [segment], _fields_of(STALE_FIELDS))


INBOX_FIELDS = (
    "kind", "severity", "since", "run_id", "subject", "detail", "action", "code", "finding_id", "stored_value",
    "recomputed_value", *TRIAGE_FIELDS,
)  # fmt: skip


def inbox(
    *, kind: str = "", severity: str = "", run_id: str = "", view: str = triage.OPEN, now: dt.datetime | None = None
) -> Listing:
    """What needs a person: the errors, then the warnings; in each, the kinds most serious
    first, and the oldest first. ``view``: open (the default), or the acknowledged or snoozed
    findings."""
    segments = inbox_items.inbox_segments(kind=kind, severity=severity, run_id=run_id, view=view, now=now)
    return Listing("inbox", INBOX_FIELDS, segments, _fields_of(INBOX_FIELDS))


# ``actor`` is the name the person had then; ``actor_id`` their id, which no rename changes
# (evidence/lib/people.py); null for a command.
DECISION_AUDIT_FIELDS = (
    "decided_at", "actor", "actor_id", "run_id", "call_id", "resolution", "reason", "receipt_sha256",
)  # fmt: skip
ACTION_AUDIT_FIELDS = ("at", "actor", "actor_id", "run_id", "action", "reason", "subject")


def audit_decisions(*, run_id: str = "", actor: str = "", resolution: str = "") -> Listing:
    """Every decision a person made on the dashboard, newest first."""
    rows = selectors.human_decisions(run_id=run_id, actor=actor, resolution=resolution)
    values = lambda d: (d.decided_at, d.actor, d.user_id, d.run.run_id, d.call_id, d.resolution, d.reason,  # noqa: E731
                        d.receipt_sha256)  # fmt: skip
    return Listing("audit", DECISION_AUDIT_FIELDS, [Segment(rows, ("-decided_at", "-id"))], values)


def audit_actions(*, run_id: str = "", actor: str = "") -> Listing:
    """Legal holds, retention's actions, exports, triage and acts on people (no run), newest first."""
    rows = selectors.audit_entries(run_id=run_id, actor=actor)
    values = lambda entry: (entry.at, entry.actor, entry.user_id, entry.run.run_id if entry.run else "",  # noqa: E731
                            entry.action, entry.reason, entry.subject)  # fmt: skip
    return Listing("audit-actions", ACTION_AUDIT_FIELDS, [Segment(rows, ("-at", "-id"))], values)


HOST_FIELDS = (
    "name", "state", "runs_root", "version", "started_at", "last_seen_at", "last_pass_seconds", "stopped_at",
    "awaiting_delivery", "oldest_undelivered_at", "failing_delivery", "refused_deliveries", "last_error",
    "last_error_at", "clock_offset_seconds", "runs_not_arriving", "pushes_refused_since", "push_refusal",
)  # fmt: skip


def hosts() -> Listing:
    """The hosts that ship runs here, by name."""
    values = lambda facts: (facts.name, facts.state, facts.host.runs_root, facts.host.version, facts.host.started_at,  # noqa: E731
                            facts.host.last_seen_at, facts.host.last_pass_seconds, facts.host.stopped_at,
                            facts.awaiting_delivery, facts.oldest_undelivered_at, facts.failing_delivery,
                            facts.refused, facts.host.last_error, facts.host.last_error_at,
                            facts.host.clock_offset_seconds, facts.stall.runs_not_arriving,
                            facts.host.push_refused_since, facts.host.push_refusal)  # fmt: skip
    return Listing("hosts", HOST_FIELDS, [Segment(Host.objects.all(), ("name",), host_facts.with_facts)], values)


RETENTION_FIELDS = ("run_id", "action", "reason", "blockers", "clock_from", "strip_on", "archive_on", "body_bytes")


def retention(*, policy: Any, now: dt.datetime, action: str = "", blocked: bool = False) -> Listing:
    """Each run's retention plan, by run_id."""
    segment = plans.plan_segment(policy=policy, now=now, action=action, blocked=blocked)
    return Listing("retention", RETENTION_FIELDS, [segment], _fields_of(RETENTION_FIELDS))
