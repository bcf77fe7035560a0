"""The inbox: everything that needs a person's decision, across runs, one list.

Five sources, each an index-backed query: calls in doubt, receipts that fail
their identity check, submission conflicts, stale reservations, and rewritten
ledgers or broken chains. Each item says its severity, its age, its run and
the next action. A settled call leaves the inbox: its decision is no longer
``confirm`` or ``query``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from django.db.models import QuerySet

from evidence.models import Call, Finding
from receipts import protocol
from receipts.findings import ERROR, WARNING

IN_DOUBT, TAMPERED, CONFLICT, STALE, LEDGER = "in doubt", "tampered", "conflict", "stale reservation", "ledger"
KINDS = (TAMPERED, LEDGER, IN_DOUBT, CONFLICT, STALE)  # the order of the filter, most serious first
LEDGER_CODES = ("ledger_rewritten", "ledger_chain_broken")


@dataclasses.dataclass(frozen=True)
class InboxItem:
    kind: str
    severity: str
    since: dt.datetime | None
    run_id: str
    subject: str  # the call_id, the client_submission_id or the finding's subject
    detail: str
    action: str  # "settle", "finding" or "reservation": what the link opens
    code: str = ""  # the finding code, for a finding


def _calls(kind: str) -> QuerySet[Call]:
    """The calls in doubt, split in two: those whose receipt proves nothing (altered, unverifiable,
    or a commit its target does not show), and the rest."""
    in_doubt = Call.objects.in_doubt()
    if kind == TAMPERED:
        return in_doubt.filter(receipt_present=True).exclude(verification=protocol.VERIFIED)
    return in_doubt.filter(verification=protocol.VERIFIED) | in_doubt.filter(receipt_present=False)


def _findings(kind: str) -> QuerySet[Finding]:
    codes = {CONFLICT: ("submission_conflict",), STALE: ("stale_reservation",), LEDGER: LEDGER_CODES}[kind]
    return Finding.objects.filter(closed_at__isnull=True, code__in=codes, run__isnull=False)


def inbox_counts(*, run_id: str = "") -> dict[str, int]:
    """How many items of each kind (five counts)."""
    counts = {}
    for kind in KINDS:
        rows = _calls(kind) if kind in (IN_DOUBT, TAMPERED) else _findings(kind)
        if run_id:
            rows = rows.filter(run__run_id=run_id)
        counts[kind] = rows.count()
    return counts


CALL_FIELDS = ("status", "verification", "updated_at", "created_at", "run__run_id", "call_id", "tool", "decision",
               "receipt_present")  # fmt: skip
FINDING_FIELDS = ("severity", "first_seen", "run__run_id", "subject", "detail", "code")


def inbox_items(*, kind: str = "", severity: str = "", run_id: str = "", limit: int = 1000) -> list[InboxItem]:
    """The items, most serious first, then the oldest first; at most ``limit`` of each kind.

    Read as plain rows: up to a thousand items of each kind are sorted together, and
    model instances would cost more than the page that shows fifty.
    """
    items: list[InboxItem] = []
    for source in KINDS if not kind else (kind,):
        calls = source in (IN_DOUBT, TAMPERED)
        rows = _calls(source) if calls else _findings(source)
        if run_id:
            rows = rows.filter(run__run_id=run_id)
        if calls:
            rows = rows.order_by("updated_at", "call_id").values_list(*CALL_FIELDS)
            items += [_call_item(source, *row) for row in rows[:limit]]
        else:
            rows = rows.order_by("first_seen", "id").values_list(*FINDING_FIELDS)
            items += [_finding_item(source, *row) for row in rows[:limit]]
    if severity:
        items = [item for item in items if item.severity == severity]
    rank = {ERROR: 0, WARNING: 1}
    oldest = dt.datetime.max.replace(tzinfo=dt.UTC)
    items.sort(key=lambda item: (rank.get(item.severity, 2), item.since or oldest, item.run_id, item.subject))
    return items


def _call_item(kind, status, verification, updated_at, created_at, run_id, call_id, tool, decision, present):
    since = updated_at or created_at
    if not present:
        detail = "the ledger names this call but its receipt is missing: what happened?"
        return InboxItem(kind, ERROR, since, run_id, call_id, detail, "settle")
    if kind == TAMPERED:
        detail = f"{status} receipt that fails its identity check ({verification}): never reused"
        return InboxItem(kind, ERROR, since, run_id, call_id, detail, "settle")
    queryable = " (the runtime can ask the target when it resumes)" if decision == "query" else ""
    detail = f"{tool}: {status}, did it happen?{queryable}"
    return InboxItem(kind, WARNING if decision == "query" else ERROR, since, run_id, call_id, detail, "settle")


def _finding_item(kind, severity, first_seen, run_id, subject, detail, code) -> InboxItem:
    action = "reservation" if kind == STALE else "finding"
    return InboxItem(kind, severity, first_seen, run_id, subject, detail, action, code)


def inbox_total() -> int:
    """How many items need a person, for the header of every page (two counts)."""
    codes = ("submission_conflict", "stale_reservation", *LEDGER_CODES)
    findings = Finding.objects.filter(closed_at__isnull=True, code__in=codes, run__isnull=False)
    return Call.objects.in_doubt().count() + findings.count()
