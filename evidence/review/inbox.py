"""The inbox: everything that needs a person's decision, across runs, one list.

Each kind an index-backed query: silent hosts, calls in doubt
(``Call.in_doubt``), receipts among them that fail their identity check,
decisions the run's host refused to write, calls settled on a host by a
confirmation no decision made here matches (``evidence.ingest.provenance``),
submission conflicts, stale reservations, rewritten ledgers or broken chains,
and abandoned runs (not finished, silent: ``models.is_abandoned``). Each item says its severity, its
age, its run and the next action. The list is keyset-paged like every other
(``inbox_segments``). A settled call leaves the inbox: it is no
longer in doubt. A finding a person acknowledged or snoozed (``evidence.review.triage``)
leaves its default view, the open one, and is listed in its own.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Callable
from typing import Any

from django.db.models import Case, Count, QuerySet, Value, When
from django.utils import translation
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext

from evidence.lib import hosts
from evidence.lib.pagination import Segment, every_row
from evidence.models import Call, Finding, Host, with_run
from evidence.review import selectors, triage
from evidence.review.kinds import (  # noqa: F401 - the inbox's kinds, read as inbox.KIND
    ABANDONED,
    CONFLICT,
    DISPUTED,
    FINDING_KINDS,
    HOST,
    HOST_DECISION,
    IN_DOUBT,
    KIND_LABELS,
    KINDS,
    LEDGER,
    LEDGER_CODES,
    REFUSED,
    STALE,
    STALLED,
    STATE_OF_KIND,
    TAMPERED,
    VERIFICATION_OF_KIND,
    call_kind,
    kind_label,
)
from evidence.words import finding_words, i18n
from receipts import protocol
from receipts.findings import CODES, ERROR, WARNING


# The inbox's kinds are the review's vocabulary (claims and triage name items by them too).
@dataclasses.dataclass(frozen=True)
class InboxItem:
    kind: str
    severity: str
    since: dt.datetime | None
    run_id: str
    subject: str  # the call_id, the client_submission_id or the finding's subject
    detail: str
    action: str  # "settle", "resume", "host", "finding" or "reservation": what the link opens
    code: str = ""  # the finding code, for a finding
    # A finding's: its id (what triage acts on), both sides of a conflict (the first request's
    # digest, then the other), and its triage (``evidence.review.triage.FIELDS``: "" when open).
    finding_id: int | None = None
    stored_value: str = ""
    recomputed_value: str = ""
    triage: str = ""
    triage_by: str = ""
    triage_at: dt.datetime | None = None
    triage_reason: str = ""
    triage_until: dt.datetime | None = None
    triage_on_change: bool = False
    # What a page shows for ``detail``, in the reader's language: the dashboard's own sentence
    # (a call in doubt, a silent host), or a finding's sentence worded from its values
    # (evidence/words/finding_words.py; the stored detail as data when it has none).
    note: SafeString | str = ""
    tool: str = ""  # a call's tool (what a notification rule may filter on)

    @property
    def kind_label(self) -> str:
        return kind_label(self.kind)

    @property
    def state(self) -> str:
        """The state this item is (``receipts.states``), or "" for a kind that is not one."""
        return STATE_OF_KIND.get(self.kind, "")


def _sources(
    *, kind: str = "", severity: str = "", run_id: str = "", view: str = triage.OPEN, now: dt.datetime | None = None
) -> list[tuple[str, QuerySet, Callable[[list[Any]], list[InboxItem]]]]:
    """(severity, rows, present) in the inbox's order: the errors, then the warnings; in each,
    the calls in doubt, then the findings. A call in doubt is an error when a person must
    decide, a warning when the runtime can ask the target (its decision, on the index that
    leads with it); a finding has its code's severity. ``view``: the findings' triage (calls in
    doubt and silent hosts are never triaged: only the open view has them)."""
    now = now or protocol.utc_now()
    calls = with_run(Call.objects.in_doubt())
    findings = with_run(Finding.objects.filter(triage.view_filter(view, now), closed_at__isnull=True,
                                               run__isnull=False))  # fmt: skip
    if view != triage.OPEN:
        calls = calls.none()
    if run_id:
        calls, findings = calls.filter(run__run_id=run_id), findings.filter(run__run_id=run_id)
    if kind in (TAMPERED, DISPUTED):
        calls = calls.filter(receipt_present=True, verification=VERIFICATION_OF_KIND[kind])
    elif kind == IN_DOUBT:
        calls = calls.exclude(receipt_present=True, verification__in=VERIFICATION_OF_KIND.values())
    elif kind:
        calls = calls.none()
    sources: list[tuple[str, QuerySet, Callable[[list[Any]], list[InboxItem]]]] = []
    if kind in ("", HOST) and severity in ("", ERROR) and not run_id and view == triage.OPEN:
        sources.append((ERROR, hosts.silent(), _host_items))
    if kind in ("", STALLED) and severity in ("", ERROR) and not run_id and view == triage.OPEN:
        sources.append((ERROR, hosts.stalled(now), functools.partial(_stalled_items, now=now)))
    for level, decision in ((ERROR, "confirm"), (WARNING, "query")):
        codes = [code for each, codes in FINDING_KINDS.items() if kind in ("", each) for code in codes
                 if CODES[code][0] == level]  # fmt: skip
        if severity in ("", level):
            if view == triage.OPEN:
                sources.append((level, calls.filter(decision=decision), _call_items))
            if codes:
                present = functools.partial(_finding_items, now=now)
                sources.append((level, findings.filter(code__in=codes), present))
    return sources


def inbox_segments(
    *, kind: str = "", severity: str = "", run_id: str = "", view: str = triage.OPEN, now: dt.datetime | None = None
) -> list[Segment]:
    """The inbox as segments on their indexes (``evidence.lib.pagination``): each oldest first, a
    call by its receipt's last update (those without one after), a finding by when it was first
    seen."""
    segments = []
    for _, rows, present in _sources(kind=kind, severity=severity, run_id=run_id, view=view, now=now):
        if rows.model is Call:
            segments.append(Segment(rows.filter(updated_at__isnull=False), ("updated_at", "id"), present))
            segments.append(Segment(rows.filter(updated_at__isnull=True), ("id",), present))
        elif rows.model is Host:
            segments.append(Segment(rows, ("last_seen_at", "id"), present))
        else:
            segments.append(Segment(selectors.with_reservation_since(rows), ("first_seen", "id"), present))
    return segments


def all_counts(*, run_id: str = "", now: dt.datetime | None = None) -> tuple[dict[str, int], dict[str, int]]:
    """How many open items of each kind, and how many of the inbox's findings are acknowledged
    and snoozed, for the filters: two grouped queries (the findings' by code and triage)."""
    now = now or protocol.utc_now()
    calls = Call.objects.in_doubt()
    findings = Finding.objects.filter(closed_at__isnull=True, run__isnull=False)
    if run_id:
        calls, findings = calls.filter(run__run_id=run_id), findings.filter(run__run_id=run_id)
    counts = dict.fromkeys(KINDS, 0)
    views = {triage.ACKNOWLEDGED: 0, triage.SNOOZED: 0}
    grouped = calls.values_list("receipt_present", "verification").annotate(n=Count("id")).order_by()
    for present, verification, count in grouped:
        counts[call_kind(present, verification)] += count
    kind_of = {code: kind for kind, codes in FINDING_KINDS.items() for code in codes}
    awake = Case(When(triage_until__lte=now, then=Value(True)), default=Value(False))
    rows = findings.filter(code__in=kind_of).annotate(awake=awake).values_list("code", "triage", "awake")
    for code, state, is_awake, count in rows.annotate(n=Count("id")).order_by():
        # triage.view_filter's rule, per group: a snooze whose time has come is open.
        if not state or (state == triage.SNOOZED and is_awake):
            counts[kind_of[code]] += count
        else:
            views[state] += count
    if not run_id:
        by_kind = hosts.needing_a_person(now)
        counts[HOST], counts[STALLED] = by_kind["silent"], by_kind["stalled"]
    return counts, views


def inbox_counts(*, run_id: str = "", now: dt.datetime | None = None) -> dict[str, int]:
    """How many open items of each kind (``all_counts``)."""
    return all_counts(run_id=run_id, now=now)[0]


def triage_counts(*, run_id: str = "", now: dt.datetime | None = None) -> dict[str, int]:
    """How many of the inbox's findings are acknowledged, and snoozed (``all_counts``)."""
    return all_counts(run_id=run_id, now=now)[1]


def inbox_items(
    *, kind: str = "", severity: str = "", run_id: str = "", view: str = triage.OPEN, now: dt.datetime | None = None
) -> list[InboxItem]:
    """Every item, in the inbox's order (the tests)."""
    return list(every_row(inbox_segments(kind=kind, severity=severity, run_id=run_id, view=view, now=now)))


# A call in doubt whose receipt is present and says this of its check is an item of its own kind;
# every other call in doubt (its receipt missing, or one that cannot be checked) is "in doubt".
def _call_items(calls: list[Call]) -> list[InboxItem]:
    items = []
    for call in calls:
        kind, since, run_id = call_kind(call.receipt_present, call.verification), _since(call), call.run.run_id
        # ``detail`` stays English (downloads and the API); ``note`` is the page's, translated.
        if not call.receipt_present:
            detail = "the ledger names this call but its receipt is missing: what happened?"
            note: SafeString | str = gettext("the ledger names this call but its receipt is missing: what happened?")
        elif kind == TAMPERED:
            detail = f"{call.status} receipt that fails its identity check ({call.verification}): never reused"
            note = format_html(
                gettext("{status} receipt that fails its identity check ({verification}): never reused"),
                status=i18n.word(call.status),
                verification=format_html('<span translate="no">{}</span>', call.verification),
            )
        elif kind == DISPUTED:
            detail = f"{call.tool}: committed, but its target does not show the result: did it happen?"
            note = format_html(
                gettext("{tool}: committed, but its target does not show the result: did it happen?"),
                tool=format_html("<code>{}</code>", call.tool),
            )
        elif call.verification == protocol.UNVERIFIABLE:
            detail = f"{call.tool}: {call.status}, and its receipt's identity cannot be checked: did it happen?"
            note = format_html(
                gettext("{tool}: {status}, and its receipt's identity cannot be checked: did it happen?"),
                tool=format_html("<code>{}</code>", call.tool),
                status=i18n.word(call.status),
            )
        else:
            asked = " (the runtime can ask the target when it resumes)" if call.decision == "query" else ""
            detail = f"{call.tool}: {call.status}, did it happen?{asked}"
            sentence = (
                gettext("{tool}: {status}, did it happen? (the runtime can ask the target when it resumes)")
                if call.decision == "query"
                else gettext("{tool}: {status}, did it happen?")
            )
            note = format_html(sentence, tool=format_html("<code>{}</code>", call.tool), status=i18n.word(call.status))
        severity = WARNING if call.decision == "query" else ERROR
        # The runtime settles a queryable call itself when the run resumes: that is the next step.
        action = "resume" if call.decision == "query" else "settle"
        items.append(InboxItem(kind, severity, since, run_id, call.call_id, detail, action, note=note, tool=call.tool))
    return items


def _host_items(silent: list[Host]) -> list[InboxItem]:
    items = []
    for host in silent:
        stopped = f"its importer stopped at {protocol.human_time(host.stopped_at)}" if host.stopped_at else ""
        detail = (stopped or "its importer has not reported since its last pass") + (
            ": the decisions about its runs wait for it, and its runs are not imported"
        )
        if host.stopped_at:
            note = gettext(
                "its importer stopped at %(time)s: the decisions about its runs wait for it, and its runs are not"
                " imported"
            ) % {"time": i18n.shown_time(host.stopped_at)}
        else:
            note = gettext(
                "its importer has not reported since its last pass: the decisions about its runs wait for it, and"
                " its runs are not imported"
            )
        items.append(InboxItem(HOST, ERROR, host.last_seen_at, "", host.name, detail, "host", note=note))
    return items


def _stalled_items(rows: list[Host], now: dt.datetime) -> list[InboxItem]:
    """A host whose path to a person stalls, each thing that stalls said (``hosts.Stall``)."""
    stalls = hosts.stalls(rows, now)
    items = []
    for host in rows:
        stall = stalls[host.pk]
        # ``detail`` stays English (downloads, the API, alerts); ``note`` is the page's, translated.
        with translation.override("en"):
            detail = "; ".join(_stall_sentences(stall))
        note = "; ".join(_stall_sentences(stall))
        items.append(InboxItem(STALLED, ERROR, stall.since or host.last_seen_at, "", host.name, detail, "host",
                               note=note))  # fmt: skip
    return items


def _stall_sentences(stall: hosts.Stall) -> list[str]:
    """What stalls, in the language active."""
    said = []
    if stall.runs_not_arriving:
        why = stall.its_problem or gettext("%(bytes)s bytes of its ledger not arrived") % {"bytes": stall.behind_bytes}
        said.append(
            ngettext("%(count)s run not arriving (%(run)s: %(why)s)", "%(count)s runs not arriving (%(run)s: %(why)s)",
                     stall.runs_not_arriving) % {"count": stall.runs_not_arriving, "run": stall.a_run, "why": why}
        )  # fmt: skip
    if stall.refused_since:
        said.append(gettext("its pushes refused since %(time)s: %(why)s")
                    % {"time": i18n.shown_time(stall.refused_since), "why": stall.refusal})  # fmt: skip
    if stall.decisions_waiting and stall.waiting_since:
        said.append(
            ngettext("%(count)s decision not written since %(time)s", "%(count)s decisions not written since %(time)s",
                     stall.decisions_waiting)
            % {"count": stall.decisions_waiting, "time": i18n.shown_time(stall.waiting_since)}
        )  # fmt: skip
    if stall.clock_offset is not None:
        message = (
            gettext("its clock is %(seconds)s s ahead of the server's: its runs' times are the server's")
            if stall.clock_ahead
            else gettext("its clock is %(seconds)s s behind the server's: its runs' times are the server's")
        )
        said.append(message % {"seconds": stall.clock_seconds})
    return said


def _finding_items(findings: list[Finding], now: dt.datetime) -> list[InboxItem]:
    kind_of = {code: kind for kind, codes in FINDING_KINDS.items() for code in codes}
    items = []
    for f in triage.as_shown(findings, now):
        assert f.run is not None  # the inbox takes only findings with a run (_sources)
        kind = kind_of[f.code]
        since = getattr(f, "reservation_since", None) or f.first_seen  # a stale reservation: the reservation's
        items.append(InboxItem(kind, f.severity, since, f.run.run_id, f.subject, f.detail,
                               "reservation" if kind == STALE else "finding", f.code, f.pk, f.stored_value,
                               f.recomputed_value, f.triage, f.triage_by, f.triage_at, f.triage_reason,
                               f.triage_until, f.triage_on_change,
                               finding_words.detail(f.sentence, f.detail_values, f.detail)))  # fmt: skip
    return items


def _since(call: Call) -> dt.datetime | None:
    return call.updated_at or call.created_at


def inbox_total() -> int:
    """How many items need a person (open: not acknowledged nor snoozed), for the header of
    every page (three counts)."""
    codes = [code for codes in FINDING_KINDS.values() for code in codes]
    open_ = triage.view_filter(triage.OPEN, protocol.utc_now())
    findings = Finding.objects.filter(open_, closed_at__isnull=True, code__in=codes, run__isnull=False)
    return Call.objects.in_doubt().count() + findings.count() + sum(hosts.needing_a_person().values())
