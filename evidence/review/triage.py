"""Triage: a person says a finding can wait, with a reason, and undoes it.

Submission conflicts, stale reservations and every other finding of a run can be
**acknowledged** (seen, and known: it leaves the inbox until it closes, or the
acknowledgement is undone) or **snoozed** until a time, or until it changes (the
import sees its detail or digests change; a stale item also when its age enters
the next class of ``AGE_CLASSES``). Each act has a reason and is an ``AuditEntry``;
so is the import ending a triage (a finding that changed under a snooze, or that
closed and opened again).

Nothing wakes a snooze: whether it is over is asked in each query, against now,
on the (triage, triage_until) index (``view_filter``). Calls in doubt are not
triaged: a person settles them (``evidence.review.settle``).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable
from http import HTTPStatus

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.utils.translation import gettext, gettext_noop

from evidence.models import AuditEntry, Call, Finding, Run, Submission
from evidence.review import claims, kinds
from receipts.findings import FindingRecord

log = logging.getLogger("callproof.triage")

OPEN, ACKNOWLEDGED, SNOOZED = "open", "acknowledged", "snoozed"
VIEWS = (OPEN, ACKNOWLEDGED, SNOOZED)  # the lists' filter: open is the default view
ACKNOWLEDGE, UNACKNOWLEDGE, SNOOZE, UNSNOOZE = "acknowledge", "unacknowledge", "snooze", "unsnooze"
ACTIONS = (ACKNOWLEDGE, UNACKNOWLEDGE, SNOOZE, UNSNOOZE)
# A stale item snoozed "until it changes" comes back when it has been stale for the next of these.
AGE_CLASSES = (dt.timedelta(hours=1), dt.timedelta(days=1), dt.timedelta(days=7), dt.timedelta(days=30))
STALE_CODES = ("stale_reservation", "stale_call")
# What the import compares: a snooze "until it changes" ends when one of these does.
WATCHED = ("detail", "stored_value", "recomputed_value", "evidence")
REASON_LIMIT = 2000


class TriageError(Exception):
    """Why nothing was recorded, the field it is about ("" for the whole form), and its status.

    ``message`` is English, for the API and the logs; ``shown`` is the same in the reader's
    language, for the page. ``values`` fill the message's ``%(name)s`` placeholders."""

    def __init__(
        self,
        message: str,
        *,
        field: str = "",
        status: HTTPStatus = HTTPStatus.BAD_REQUEST,
        values: dict[str, object] | None = None,
    ) -> None:
        self.template, self.values = message, values or {}
        english = message % self.values if values else message
        super().__init__(english)
        self.message, self.field, self.status = english, field, status

    @property
    def shown(self) -> str:
        translated = gettext(self.template)
        return translated % self.values if self.values else translated


def view_filter(view: str, now: dt.datetime) -> Q:
    """The findings of one view: open (never triaged, or a snooze whose time has come),
    acknowledged, or snoozed (and not yet due)."""
    awake = Q(triage=SNOOZED, triage_until__lte=now)
    if view == ACKNOWLEDGED:
        return Q(triage=ACKNOWLEDGED)
    if view == SNOOZED:
        return Q(triage=SNOOZED) & ~awake
    return Q(triage="") | awake


# A finding's triage columns, as the lists and the API give them.
FIELDS = ("triage", "triage_by", "triage_at", "triage_reason", "triage_until", "triage_on_change")
SNOOZE_AT_MOST = dt.timedelta(days=366)  # a snooze ends within a year (and a day: a leap year's date)


def as_shown(findings: list[Finding], now: dt.datetime) -> list[Finding]:
    """Rows as a list shows them: a snooze whose time has come reads as open (in memory only)."""
    for finding in findings:
        if shown_state(finding, now) == OPEN and finding.triage:
            for name, value in _cleared().items():
                setattr(finding, name, value)
    return findings


def shown_state(finding: Finding, now: dt.datetime) -> str:
    """``view_filter``'s rule for one row."""
    if finding.triage == SNOOZED and finding.triage_until is not None and finding.triage_until <= now:
        return OPEN
    return finding.triage or OPEN


def next_age_change(finding: Finding, now: dt.datetime) -> dt.datetime | None:
    """When a stale item's age enters its next class (None: not a stale item, or in the last)."""
    if finding.code not in STALE_CODES or finding.run_id is None:
        return None
    if finding.code == "stale_reservation":
        times = Submission.objects.filter(run_id=finding.run_id, record_key=finding.record_key)
        row = times.values_list("updated_at", "reserved_at").first()
    else:
        row = (
            Call.objects.filter(run_id=finding.run_id, call_id=finding.call_id)
            .values_list("updated_at", "created_at")
            .first()
        )
    since = None if row is None else (row[0] or row[1])
    if since is None:
        return None
    return next((since + age for age in AGE_CLASSES if since + age > now), None)


def act(
    *,
    finding: Finding,
    user: User,
    action: str,
    reason: str,
    until: dt.datetime | None = None,
    on_change: bool = False,
    now: dt.datetime,
) -> Finding:
    """Record ``user``'s triage of ``finding`` and its audit entry, all or nothing; returns the row."""
    if action not in ACTIONS:
        raise TriageError(gettext_noop("Choose one of: %(actions)s."), field="action",
                          values={"actions": ", ".join(ACTIONS)})  # fmt: skip
    reason = reason.strip()
    if not reason:
        raise TriageError(gettext_noop("Give a reason: the next person to look reads it."), field="reason")
    if len(reason) > REASON_LIMIT:
        raise TriageError(gettext_noop("Keep the reason under %(limit)s characters."), field="reason",
                          values={"limit": REASON_LIMIT})  # fmt: skip
    if action == SNOOZE:
        if until is None and not on_change:
            raise TriageError(gettext_noop("Say until when: a time, or until it changes."), field="snooze")
        if until is not None and until <= now:
            raise TriageError(gettext_noop("That time has passed: choose a later one."), field="until")
        if until is not None and until > now + SNOOZE_AT_MOST:
            # A time a client chose, bounded: far enough ahead, a zone's offset made it a year
            # PostgreSQL stores and Python cannot read (9999-12-31T23:59:59-14:00), and every
            # page that showed the finding answered 500 for good.
            raise TriageError(gettext_noop("At most a year ahead: choose an earlier time, or until it changes."),
                              field="until")  # fmt: skip
    with transaction.atomic():
        # Two people at once queue on the row (PostgreSQL) or the immediate transaction (SQLite).
        locked = Finding.objects.select_for_update().filter(pk=finding.pk).first()
        if locked is None or locked.run_id is None:
            raise TriageError(gettext_noop("Only a run's findings are triaged."), status=HTTPStatus.NOT_FOUND)
        if locked.closed_at is not None:
            raise TriageError(gettext_noop("This finding closed: it no longer holds, nothing to triage."),
                              status=HTTPStatus.CONFLICT)  # fmt: skip
        state = shown_state(locked, now)
        if action == UNACKNOWLEDGE and state != ACKNOWLEDGED:
            raise TriageError(gettext_noop("This finding is not acknowledged."), status=HTTPStatus.CONFLICT)
        if action == UNSNOOZE and state != SNOOZED:
            raise TriageError(gettext_noop("This finding is not snoozed (or its snooze is over)."),
                              status=HTTPStatus.CONFLICT)  # fmt: skip
        if action in (UNACKNOWLEDGE, UNSNOOZE):
            values = _cleared()
        else:
            if on_change and action == SNOOZE:
                age_change = next_age_change(locked, now)
                until = min(until, age_change) if until and age_change else until or age_change
            values = {
                "triage": ACKNOWLEDGED if action == ACKNOWLEDGE else SNOOZED,
                "triage_until": until if action == SNOOZE else None,
                "triage_on_change": on_change and action == SNOOZE,
                "triage_reason": reason,
                "triage_by": user.get_username(),
                "triage_at": now,
            }
        Finding.objects.filter(pk=locked.pk).update(**values)
        audit_action = {ACKNOWLEDGE: AuditEntry.ACKNOWLEDGED, UNACKNOWLEDGE: AuditEntry.UNACKNOWLEDGED,
                        SNOOZE: AuditEntry.SNOOZED, UNSNOOZE: AuditEntry.UNSNOOZED}[action]  # fmt: skip
        AuditEntry.objects.create(
            run_id=locked.run_id, action=audit_action, actor=user.get_username(), user=user, at=now,
            reason=_audit_reason(action, reason, values), subject=locked.label,
        )  # fmt: skip
        if action in (ACKNOWLEDGE, SNOOZE):  # it leaves the inbox: whoever said "I'm on it" is done
            item_kinds = [kind for kind, codes in kinds.FINDING_KINDS.items() if locked.code in codes]
            assert locked.run is not None  # checked above: only a run's findings are triaged
            claims.acted(run=locked.run, kinds=item_kinds, subject=locked.subject, user=user, how=action + "d", now=now)
    log.info(audit_action.replace("_", " "), extra={"event": audit_action, "finding": locked.label,
                                                    "actor": user.get_username()})  # fmt: skip
    locked.refresh_from_db()
    return locked


def _cleared() -> dict:
    return {"triage": "", "triage_until": None, "triage_on_change": False, "triage_reason": "", "triage_by": "",
            "triage_at": None}  # fmt: skip


def _audit_reason(action: str, reason: str, values: dict) -> str:
    if action != SNOOZE:
        return reason
    ends = []
    if values["triage_until"] is not None:
        ends.append(f"until {values['triage_until'].isoformat().replace('+00:00', 'Z')}")
    if values["triage_on_change"]:
        ends.append("until it changes")
    return f"{reason} (snoozed {' or '.join(ends)})"


def end_on_change(run: Run, records: Iterable[FindingRecord], now: dt.datetime) -> None:
    """Before the import stores ``records`` on ``run``: end the triage of each finding that
    closed and now opens again, and the snooze of each snoozed "until it changes" whose
    watched values differ. One query on the triage index (people triage few findings); an
    audit entry each, by "import"."""
    triaged = {
        (f.code, f.subject): f
        for f in Finding.objects.filter(run=run, triage__in=(ACKNOWLEDGED, SNOOZED)).only(
            "id", "code", "subject", "closed_at", "triage", "triage_on_change", *WATCHED
        )
    }
    if not triaged:
        return
    ended = []
    for record in records:
        finding = triaged.pop((record.code, record.subject[:400]), None)
        if finding is None:
            continue
        if finding.closed_at is not None:
            ended.append((finding, "it had closed, and opened again"))
        elif finding.triage == SNOOZED and finding.triage_on_change:
            changed = [name for name in WATCHED if getattr(record, name) != getattr(finding, name)]
            if changed:
                ended.append((finding, f"it changed ({', '.join(changed)}): {record.detail}"[:REASON_LIMIT]))
    for finding, why in ended:
        Finding.objects.filter(pk=finding.pk).update(**_cleared())
        AuditEntry.objects.create(run=run, action=AuditEntry.TRIAGE_ENDED, actor="import", at=now,
                                  reason=f"{finding.triage} no longer: {why}", subject=finding.label)  # fmt: skip
        log.info("triage ended", extra={"event": AuditEntry.TRIAGE_ENDED, "run_id": run.run_id,
                                        "finding": finding.label})  # fmt: skip
