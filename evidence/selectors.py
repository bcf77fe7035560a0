"""Reads for the pages: plain functions with keyword-only arguments.

Each returns rows or small dataclasses and runs a fixed number of queries,
whatever the size of the run: lists are paginated by the caller and
per-row facts are fetched for one page at a time with grouped queries.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import shlex
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from django.db.models import Case, Count, DateTimeField, OuterRef, Q, QuerySet, Subquery, Value, When
from django.db.models.functions import Coalesce

from evidence import hosts, stats
from evidence.models import (
    AuditEntry,
    Call,
    Confirmation,
    Event,
    EventTally,
    Finding,
    HumanDecision,
    Run,
    Submission,
    with_run,
)
from evidence.stats import RunSummary
from receipts import doubt, protocol
from receipts.findings import DIGEST_CODES
from receipts.recovery import reservation_resume
from receipts.tools import BUILTIN_ADAPTERS

STALE_CODES = ("stale_reservation", "stale_call")
HEX_RE = re.compile(r"[0-9a-f]{4,64}")


def prefix_upper_bound(prefix: str) -> str:
    """The smallest string greater than every string that starts with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def calls_with_prefix(*, prefix: str) -> QuerySet[Call]:
    """Calls whose call_id starts with ``prefix``, as a range scan on the call_id index.

    ``LIKE 'abc%'`` cannot use an index on SQLite (it is case-insensitive
    there); ``call_id >= 'abc' AND call_id < 'abd'`` can, on both databases.
    """
    if not prefix:
        return Call.objects.none()
    return Call.objects.filter(call_id__gte=prefix, call_id__lt=prefix_upper_bound(prefix))


# --- runs ------------------------------------------------------------------


def runs_list(*, state: str = "", attention: bool = False) -> QuerySet[Run]:
    """Runs in ``state``; ``attention``: those with open findings or calls in doubt (as counted
    at import time). ``listings.runs`` gives their order."""
    runs = Run.objects.all()
    if state:
        runs = runs.filter(state=state)
    if attention:
        runs = runs.filter(needs_attention=True)
    return runs


@dataclasses.dataclass(frozen=True)
class RunFacets:
    """How many runs there are by state and by whether they need attention: the runs list's
    filters and counts, from one grouped query over the runs (a row a run, never an event)."""

    counts: dict[tuple[str, bool], int]

    @property
    def states(self) -> list[str]:
        return sorted({state for state, _ in self.counts})

    @property
    def runs(self) -> int:
        return sum(self.counts.values())

    @property
    def attention(self) -> int:
        return self.total(attention=True)

    def total(self, *, state: str = "", attention: bool = False) -> int:
        return sum(n for (s, needs), n in self.counts.items() if (not state or s == state) and (needs or not attention))


def run_facets() -> RunFacets:
    rows = Run.objects.values_list("state", "needs_attention").annotate(n=Count("id")).order_by()
    return RunFacets({(state, needs): count for state, needs, count in rows})


def run_summaries(*, runs: Iterable[Run]) -> dict[int, RunSummary]:
    """Each run's summary as its last import stored it: no query."""
    return {run.pk: RunSummary.of(run) for run in runs}


@dataclasses.dataclass(frozen=True)
class Target:
    """Something a person can open: a run, a call, or a submission in its run."""

    kind: str  # "run", "call" or "submission"
    run_id: str
    key: str = ""  # the call_id or the client_submission_id
    label: str = ""


def search(*, query: str, limit: int = 20) -> list[Target]:
    """What a query names: run ids (whole or in part), call_ids by prefix (hex, any case),
    client_submission_ids and task ids; at most ``limit`` of each, each with its context."""
    query = query.strip()
    if not query:
        return []
    matches = []
    runs = Run.objects.filter(run_id__icontains=query).order_by("run_id")
    for run_id, state, events in runs.values_list("run_id", "state", "event_count")[:limit]:
        matches.append(Target("run", run_id, label=f"run {run_id} ({state or 'no state'}, {events} events)"))
    prefix = query.lower()
    if HEX_RE.fullmatch(prefix):
        calls = calls_with_prefix(prefix=prefix).values_list("run__run_id", "call_id", "status", "tool")
        for run_id, call_id, status, tool in calls[:limit]:
            matches.append(Target("call", run_id, call_id, f"call {call_id[:16]}… ({status or 'no receipt'} {tool})"))
    submissions = Submission.objects.filter(Q(client_submission_id=query) | Q(task_id__iexact=query))
    fields = ("run__run_id", "client_submission_id", "task_id", "state")
    for run_id, submission_id, task_id, state in submissions.values_list(*fields)[:limit]:
        label = f"submission {submission_id} → {task_id or 'no task'} ({state}) in {run_id}"
        matches.append(Target("submission", run_id, submission_id, label))
    return matches


# --- one run ---------------------------------------------------------------


def call_identity(*, call: Call, run: Run) -> protocol.IdentityCheck:
    """The protocol's identity check over the receipt as it was imported (no file is read).

    A run whose bodies were stripped keeps the verdict its import made: the args
    are digests now, and a call_id cannot be recomputed from them.
    """
    if run.bodies_stripped_at is not None:
        inputs = {
            "identity": call.identity or protocol.IDENTITY_V1,
            "contract_sha256": call.contract_sha256 or run.contract_sha256,
            "attempt": call.attempt,
            "tool": call.tool,
            "tool_version": call.tool_version or None,
        }
        return protocol.IdentityCheck(call.verification, call.recomputed_call_id, inputs)
    receipt = {
        "call_id": call.declared_call_id,
        "attempt": call.attempt,
        "tool": call.tool,
        "args": call.args,
    }
    # The reader stores an absent field as "": absent again here, as in the file.
    for name in ("identity", "contract_sha256", "tool_version", "input_sha256"):
        if getattr(call, name):
            receipt[name] = getattr(call, name)
    return protocol.check_receipt_identity(receipt, call_id=call.call_id, contract_sha256=run.contract_sha256 or None)


def run_calls(*, run: Run) -> QuerySet[Call]:
    return Call.objects.filter(run=run).order_by("call_id")


def run_submissions(*, run: Run, client_submission_id: str = "") -> QuerySet[Submission]:
    submissions = Submission.objects.filter(run=run).order_by("client_submission_id")
    if client_submission_id:
        submissions = submissions.filter(client_submission_id=client_submission_id)
    return submissions


def run_open_findings(*, run: Run, limit: int = 200) -> QuerySet[Finding]:
    return run.findings.filter(closed_at__isnull=True).order_by("code", "subject")[:limit]


@dataclasses.dataclass
class CallDetail:
    identity: protocol.IdentityCheck | None  # None when the ledger names a call with no receipt
    events: list[Event]
    confirmation: Confirmation | None
    findings: list[Finding]
    decision: HumanDecision | None  # a person's decision made on the dashboard


def call_detail(*, run: Run, call: Call, event_limit: int = 200) -> CallDetail:
    """What the call page shows beside the receipt: five queries."""
    return CallDetail(
        identity=call_identity(call=call, run=run) if call.receipt_present else None,
        events=list(Event.objects.filter(run=run, call_id=call.call_id).order_by("seq")[:event_limit]),
        confirmation=Confirmation.objects.filter(run=run, call_id=call.call_id).first(),
        findings=list(run.findings.filter(call_id=call.call_id, closed_at__isnull=True).order_by("code")),
        decision=HumanDecision.objects.filter(run=run, call_id=call.call_id).first(),
    )


@dataclasses.dataclass
class DoubtPanel:
    """What a person reads before settling a call in doubt."""

    description: str  # what the call was meant to do
    evidence: doubt.Evidence | None  # what the target's side shows (None: nothing can look)
    confirmation_file: str  # what the form would write, for an operator who settles by hand
    command: str  # the same, with the writer's command line


def doubt_panel(*, run: Run, call: Call) -> DoubtPanel:
    """The call in plain words and the target's evidence (read from the run directory, bounded)."""
    template = {
        "schema": protocol.CONFIRMATION_SCHEMA,
        "call_id": call.call_id,
        "resolution": "committed or rejected",
        "reason": "what you checked",
        "actor": "your name",
        "confirmed_at": "now, RFC 3339 UTC",
        "receipt_sha256": call.file_sha256,
        "confirmation_id": "sha256(canonical_json({call_id, resolution, receipt_sha256}))",
    }
    command = (
        f"python -m receipts confirm {shlex.quote(run.path)} {call.call_id} --resolution committed "
        f"--reason 'what you checked' --actor \"$USER\" --receipt-sha256 {call.file_sha256}"
    )
    return DoubtPanel(
        description=doubt.describe(call.tool, call.args),
        evidence=(
            doubt.evidence_for(Path(run.path), call.tool, call.args, call.call_id, BUILTIN_ADAPTERS)
            if hosts.owns(run)
            else doubt.Evidence(doubt.UNCLEAR, (f"the run's files are on host {run.host}: its target is read there",))
        ),
        confirmation_file=json.dumps(template, indent=2),
        command=command,
    )


def audit_entries(*, run_id: str = "", actor: str = "") -> QuerySet[AuditEntry]:
    """Legal holds and retention actions, newest first (the audit, beside the decisions)."""
    entries = with_run(AuditEntry.objects.all())
    if run_id:
        entries = entries.filter(run__run_id=run_id)
    if actor:
        entries = entries.filter(actor=actor)
    return entries.order_by("-at", "-id")


def human_decisions(*, run_id: str = "", actor: str = "", resolution: str = "") -> QuerySet[HumanDecision]:
    """Every decision a person made on the dashboard, newest first (the audit)."""
    decisions = with_run(HumanDecision.objects.all())
    if run_id:
        decisions = decisions.filter(run__run_id=run_id)
    if actor:
        decisions = decisions.filter(actor=actor)
    if resolution:
        decisions = decisions.filter(resolution=resolution)
    return decisions.order_by("-decided_at", "-id")


def run_events(*, run: Run, event_type: str = "") -> QuerySet[Event]:
    events = Event.objects.filter(run=run)
    if event_type:
        events = events.filter(type=event_type)
    return events.order_by("-seq")


def event_types(*, run: Run) -> list[str]:
    return sorted(run.event_type_counts)


def reuse_counts(*, run: Run, call_ids: Iterable[str]) -> dict[str, int]:
    """How many times each call was reused (``call_reused`` events): one query."""
    rows = (
        Event.objects.filter(run=run, type="call_reused", call_id__in=list(call_ids))
        .values_list("call_id")
        .annotate(n=Count("id"))
    )
    return dict(rows)


def disposition_history(*, run: Run, submission_ids: Iterable[str]) -> dict[str, list[Event]]:
    """Every ``submission`` event of these submissions, in ledger order: one query."""
    history: dict[str, list[Event]] = defaultdict(list)
    events = Event.objects.filter(run=run, type="submission", client_submission_id__in=list(submission_ids)).order_by(
        "seq"
    )
    for event in events:
        history[event.client_submission_id].append(event)
    return history


def legacy_submissions(*, run: Run) -> QuerySet[Event]:
    """Task creations without a client_submission_id: no record, only their events."""
    return Event.objects.filter(run=run, type="submission", client_submission_id="").order_by("seq")


def events_histogram(*, run: Run, buckets: int = 24) -> list[tuple[dt.datetime, int]]:
    """Events per equal slice of the run's time span, from the per-minute tallies: one
    query over at most one row per minute of the run, whatever its number of events."""
    if run.first_event_at is None or run.last_event_at is None:
        return []
    first = stats.minute_of(run.first_event_at)
    span = max(stats.minute_of(run.last_event_at) - first + 1, 1)
    width = dt.timedelta(minutes=span) / buckets
    start = stats.EPOCH + dt.timedelta(minutes=first)
    counts = [0] * buckets
    for minute, count in EventTally.objects.filter(run=run).values_list("minute", "count"):
        counts[min(buckets - 1, max(0, (minute - first) * buckets // span))] += count
    return [(start + width * index, counts[index]) for index in range(buckets)]


def decision_counts(*, run: Run) -> list[tuple[str, int]]:
    """How many calls get each recovery decision, most urgent first (as counted at import)."""
    counts = RunSummary.of(run).decisions
    return [(decision, counts[decision]) for decision in protocol.DECISIONS if counts.get(decision)]


def calls_by_decision(*, run: Run, decision: str = "") -> QuerySet[Call]:
    """The run's calls, most urgent decision first (a person's call before a reuse)."""
    rank = Case(*(When(decision=d, then=Value(i)) for i, d in enumerate(protocol.DECISIONS)), default=Value(99))
    calls = Call.objects.filter(run=run)
    if decision:
        calls = calls.filter(decision=decision)
    return calls.annotate(rank=rank).order_by("rank", "call_id")


def decision_segments(*, run: Run, decision: str = "") -> list[QuerySet[Call]]:
    """The same calls as ``calls_by_decision``, as one call_id-ordered list per decision (most
    urgent first) that keyset pagination walks on the (run, decision, call_id) index."""
    counts = dict(decision_counts(run=run))
    chosen = [decision] if decision else [d for d in protocol.DECISIONS if counts.get(d)]
    return [Call.objects.filter(run=run, decision=d) for d in chosen]


# --- findings and reservations --------------------------------------------


def open_findings(
    *, code: str = "", run_id: str = "", severity: str = ""
) -> tuple[QuerySet[Finding], QuerySet[Finding]]:
    """Open findings: (the digest mismatches, every other), each to be read by code and id."""
    findings = with_run(Finding.objects.filter(closed_at__isnull=True))
    if code:
        findings = findings.filter(code=code)
    if run_id:
        findings = findings.filter(run__run_id=run_id)
    if severity:
        findings = findings.filter(severity=severity)
    return findings.filter(code__in=DIGEST_CODES), findings.exclude(code__in=DIGEST_CODES)


def finding_counts() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Open findings by code: (digest mismatches, the others), each ``[(code, count)]``."""
    counts = Counter(dict(Finding.objects.filter(closed_at__isnull=True).values_list("code").annotate(n=Count("id"))))
    digest = [(code, counts[code]) for code in DIGEST_CODES if counts.get(code)]
    others = sorted((code, count) for code, count in counts.items() if code not in DIGEST_CODES)
    return digest, others


@dataclasses.dataclass
class StaleItem:
    kind: str  # "reservation" or "call"
    run_id: str
    subject: str  # the client_submission_id or the call_id
    state: str
    since: dt.datetime | None
    task_present: bool | None
    digests_match: bool | None
    resume: str


def stale_findings() -> QuerySet[Finding]:
    """The open stale_reservation and stale_call findings (the stale page reads them by key)."""
    return Finding.objects.filter(closed_at__isnull=True, code__in=STALE_CODES, run__isnull=False)


def with_reservation_since(findings: QuerySet[Finding]) -> QuerySet[Finding]:
    """The findings, each stale_reservation with ``reservation_since``: since when its reservation
    has been in its state, as the reader judges it stale (its record's last update, else its
    reservation). The finding was seen at an import, maybe long after. A subquery per row of
    the page, not one query more."""
    reservation = Submission.objects.filter(run=OuterRef("run"), record_key=OuterRef("record_key"))
    since = reservation.annotate(since=Coalesce("updated_at", "reserved_at")).values("since")[:1]
    return findings.annotate(
        reservation_since=Case(
            When(code="stale_reservation", then=Subquery(since)), default=None, output_field=DateTimeField()
        )
    )


def stale_items(findings: Iterable[Finding]) -> list[StaleItem]:
    """What each stale finding is about, with what a resume would do: two queries a page,
    for the submissions and the calls its findings name."""
    findings = list(findings)
    runs = dict(Run.objects.filter(pk__in={f.run_id for f in findings}).values_list("pk", "run_id"))
    keys = {finding.record_key for finding in findings if finding.code == "stale_reservation"}
    fields = ("run_id", "record_key", "client_submission_id", "state", "updated_at", "reserved_at", "task_present")
    submissions = {
        (row[0], row[1]): row
        for row in Submission.objects.filter(record_key__in=keys).values_list(*fields, "task_matches")
    }
    call_ids = {finding.call_id for finding in findings if finding.code == "stale_call"}
    fields = ("run_id", "call_id", "status", "updated_at", "created_at", "decision", "decision_reason")
    calls = {(row[0], row[1]): row for row in Call.objects.filter(call_id__in=call_ids).values_list(*fields)}
    items = []
    for finding in findings:
        assert finding.run_id is not None  # a stale finding has a run (stale_findings)
        run_id = runs[finding.run_id]
        if finding.code == "stale_reservation":
            submission = submissions.get((finding.run_id, finding.record_key))
            if submission is not None:
                items.append(_stale_reservation(run_id, *submission[2:]))
        elif (call := calls.get((finding.run_id, finding.call_id))) is not None:
            _, _, status, updated_at, created_at, decision, reason = call
            since = updated_at or created_at
            items.append(StaleItem("call", run_id, finding.call_id, status, since, None, None, f"{decision}: {reason}"))
    return items


def _stale_reservation(
    run_id: str,
    client_submission_id: str,
    state: str,
    updated_at: dt.datetime | None,
    reserved_at: dt.datetime | None,
    task_present: bool,
    task_matches: bool,
) -> StaleItem:
    resume = reservation_resume(state=state, task_present=task_present, digests_match=task_matches)
    return StaleItem(
        "reservation",
        run_id,
        client_submission_id,
        state,
        updated_at or reserved_at,
        task_present,
        task_matches if task_present else None,
        resume,
    )
