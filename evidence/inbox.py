"""The inbox: everything that needs a person's decision, across runs, one list.

Seven kinds, each an index-backed query: silent hosts, calls in doubt
(``Call.in_doubt``), receipts among them that fail their identity check,
submission conflicts, stale reservations, rewritten ledgers or broken chains,
and abandoned runs (not finished, silent: ``models.is_abandoned``). Each item says its
severity, its age, its run and the next action. The list is keyset-paged like
every other (``inbox_segments``). A settled call leaves the inbox: it is no
longer in doubt.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any

from django.db.models import Count, QuerySet

from evidence import hosts, selectors
from evidence.models import Call, Finding, Host, with_run
from evidence.pagination import Segment, every_row
from receipts import protocol
from receipts.findings import CODES, ERROR, WARNING

IN_DOUBT, TAMPERED, CONFLICT, STALE, LEDGER = "in doubt", "tampered", "conflict", "stale reservation", "ledger"
HOST = "silent host"  # a host whose importer stopped reporting: its runs' decisions wait
# A run that stopped writing before it finished: someone resumes it or ends it (retention keeps it till then).
ABANDONED = "abandoned run"
KINDS = (HOST, TAMPERED, LEDGER, IN_DOUBT, CONFLICT, STALE, ABANDONED)  # the order of the filter, most serious first
LEDGER_CODES = ("ledger_rewritten", "ledger_chain_broken")
FINDING_KINDS = {
    LEDGER: LEDGER_CODES,
    CONFLICT: ("submission_conflict",),
    STALE: ("stale_reservation",),
    ABANDONED: ("run_abandoned",),
}


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


def _sources(
    *, kind: str = "", severity: str = "", run_id: str = ""
) -> list[tuple[str, QuerySet, Callable[[list[Any]], list[InboxItem]]]]:
    """(severity, rows, present) in the inbox's order: the errors, then the warnings; in each,
    the calls in doubt, then the findings. A call in doubt is an error when a person must
    decide, a warning when the runtime can ask the target (its decision, on the index that
    leads with it); a finding has its code's severity."""
    calls = with_run(Call.objects.in_doubt())
    findings = with_run(Finding.objects.filter(closed_at__isnull=True, run__isnull=False))
    if run_id:
        calls, findings = calls.filter(run__run_id=run_id), findings.filter(run__run_id=run_id)
    if kind == TAMPERED:
        calls = calls.filter(receipt_present=True).exclude(verification=protocol.VERIFIED)
    elif kind == IN_DOUBT:
        calls = calls.filter(verification=protocol.VERIFIED) | calls.filter(receipt_present=False)
    elif kind:
        calls = calls.none()
    sources: list[tuple[str, QuerySet, Callable[[list[Any]], list[InboxItem]]]] = []
    if kind in ("", HOST) and severity in ("", ERROR) and not run_id:
        sources.append((ERROR, hosts.silent(), _host_items))
    for level, decision in ((ERROR, "confirm"), (WARNING, "query")):
        codes = [code for each, codes in FINDING_KINDS.items() if kind in ("", each) for code in codes
                 if CODES[code][0] == level]  # fmt: skip
        if severity in ("", level):
            sources.append((level, calls.filter(decision=decision), _call_items))
            if codes:
                sources.append((level, findings.filter(code__in=codes), _finding_items))
    return sources


def inbox_segments(*, kind: str = "", severity: str = "", run_id: str = "") -> list[Segment]:
    """The inbox as segments on their indexes (``evidence.pagination``): each oldest first, a
    call by its receipt's last update (those without one after), a finding by when it was first
    seen."""
    segments = []
    for _, rows, present in _sources(kind=kind, severity=severity, run_id=run_id):
        if rows.model is Call:
            segments.append(Segment(rows.filter(updated_at__isnull=False), ("updated_at", "id"), present))
            segments.append(Segment(rows.filter(updated_at__isnull=True), ("id",), present))
        elif rows.model is Host:
            segments.append(Segment(rows, ("last_seen_at", "id"), present))
        else:
            segments.append(Segment(selectors.with_reservation_since(rows), ("first_seen", "id"), present))
    return segments


def inbox_counts(*, run_id: str = "") -> dict[str, int]:
    """How many items of each kind, for the filters: two grouped queries."""
    calls = Call.objects.in_doubt()
    findings = Finding.objects.filter(closed_at__isnull=True, run__isnull=False)
    if run_id:
        calls, findings = calls.filter(run__run_id=run_id), findings.filter(run__run_id=run_id)
    counts = dict.fromkeys(KINDS, 0)
    grouped = calls.values_list("receipt_present", "verification").annotate(n=Count("id")).order_by()
    for present, verification, count in grouped:
        counts[_call_kind(present, verification)] += count
    kind_of = {code: kind for kind, codes in FINDING_KINDS.items() for code in codes}
    grouped = findings.filter(code__in=kind_of).values_list("code").annotate(n=Count("id")).order_by()
    for code, count in grouped:
        counts[kind_of[code]] += count
    counts[HOST] = 0 if run_id else hosts.silent().count()
    return counts


def inbox_items(*, kind: str = "", severity: str = "", run_id: str = "") -> list[InboxItem]:
    """Every item, in the inbox's order (the tests)."""
    return list(every_row(inbox_segments(kind=kind, severity=severity, run_id=run_id)))


def _call_kind(present: bool, verification: str) -> str:
    return TAMPERED if present and verification != protocol.VERIFIED else IN_DOUBT


def _call_items(calls: list[Call]) -> list[InboxItem]:
    items = []
    for call in calls:
        kind, since, run_id = _call_kind(call.receipt_present, call.verification), _since(call), call.run.run_id
        if not call.receipt_present:
            detail = "the ledger names this call but its receipt is missing: what happened?"
        elif kind == TAMPERED:
            detail = f"{call.status} receipt that fails its identity check ({call.verification}): never reused"
        else:
            asked = " (the runtime can ask the target when it resumes)" if call.decision == "query" else ""
            detail = f"{call.tool}: {call.status}, did it happen?{asked}"
        severity = WARNING if call.decision == "query" else ERROR
        items.append(InboxItem(kind, severity, since, run_id, call.call_id, detail, "settle"))
    return items


def _host_items(silent: list[Host]) -> list[InboxItem]:
    items = []
    for host in silent:
        stopped = f"its importer stopped at {protocol.human_time(host.stopped_at)}" if host.stopped_at else ""
        detail = (stopped or "its importer has not reported since its last pass") + (
            ": the decisions about its runs wait for it, and its runs are not imported"
        )
        items.append(InboxItem(HOST, ERROR, host.last_seen_at, "", host.name, detail, "host"))
    return items


def _finding_items(findings: list[Finding]) -> list[InboxItem]:
    kind_of = {code: kind for kind, codes in FINDING_KINDS.items() for code in codes}
    items = []
    for f in findings:
        assert f.run is not None  # the inbox takes only findings with a run (_sources)
        kind = kind_of[f.code]
        since = getattr(f, "reservation_since", None) or f.first_seen  # a stale reservation: the reservation's
        items.append(InboxItem(kind, f.severity, since, f.run.run_id, f.subject, f.detail,
                               "reservation" if kind == STALE else "finding", f.code))  # fmt: skip
    return items


def _since(call: Call) -> dt.datetime | None:
    return call.updated_at or call.created_at


def inbox_total() -> int:
    """How many items need a person, for the header of every page (two counts)."""
    codes = [code for codes in FINDING_KINDS.values() for code in codes]
    findings = Finding.objects.filter(closed_at__isnull=True, code__in=codes, run__isnull=False)
    return Call.objects.in_doubt().count() + findings.count() + hosts.silent().count()
