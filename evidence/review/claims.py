""" "I'm on it": a person claims an inbox item, so that the others see someone has it.

A claim is on one item, named as the inbox names it: its kind, its run and its subject (a
call_id, a finding's subject). Whoever may act on the item may claim it: a call in doubt or a
tampered receipt, whoever may settle it; a finding, whoever may triage it (``evidence.lib.roles``).
A silent host is no one's act on the dashboard: it is not claimed.

A claim ends when its person lets it go, when anyone settles or triages the item (it leaves the
inbox), or after ``EVIDENCE_CLAIM_MINUTES``. Nothing wakes a claim that ran out: every read asks
``expires_at`` against now, and the sweep (``expire``: before each claim, and the worker's
maintenance) removes the ones over and audits them. Another person may take an expired claim
as if there were none; taking a live one needs ``take_over`` (the page asks first). Every
claim, release, expiry and takeover is an ``AuditEntry`` naming the person by id.

Two people claiming at once: one row an item (a unique constraint), locked while it is read and
changed, so exactly one wins and the other is told who has it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils.translation import gettext, gettext_noop
from django_tasks import task

from evidence.lib import people
from evidence.lib.roles import TRIAGE
from evidence.models import AuditEntry, Call, Claim, Finding, Run
from evidence.review import kinds
from receipts import protocol

log = logging.getLogger("callproof.claims")

CLAIM, RELEASE = "claim", "release"
ACTIONS = (CLAIM, RELEASE)
CALL_KINDS = (kinds.IN_DOUBT, kinds.TAMPERED, kinds.DISPUTED)
CONFIRM = "receipts.confirm_call"


def permission_for(kind: str) -> str | None:
    """What a person needs to claim an item of ``kind``: what acting on it needs (None: no one)."""
    if kind in CALL_KINDS:
        return CONFIRM
    if kind in kinds.FINDING_KINDS:
        return TRIAGE
    return None


def may_claim(user: Any, kind: str) -> bool:
    needed = permission_for(kind)
    return needed is not None and user.has_perm(needed) and not settings.EVIDENCE_READ_ONLY


class ClaimError(Exception):
    """Why nothing changed (``message`` English, ``shown`` in the reader's language), its status,
    and the claim that stands in the way, if one does."""

    def __init__(self, message: str, *, status: HTTPStatus, held: Claim | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.held = message, status, held

    @property
    def shown(self) -> str:
        return gettext(self.message)


@dataclasses.dataclass(frozen=True)
class Item:
    """An inbox item as a claim names it."""

    kind: str
    run_id: str
    subject: str

    @property
    def key(self) -> str:
        return key_of(self.kind, self.run_id, self.subject)

    @property
    def kind_label(self) -> str:
        return kinds.kind_label(self.kind)


def key_of(kind: str, run_id: str, subject: str) -> str:
    return f"{kind}\x1f{run_id}\x1f{subject}"


def lasts() -> dt.timedelta:
    return dt.timedelta(minutes=settings.EVIDENCE_CLAIM_MINUTES)


def _live(now: dt.datetime) -> Q:
    return Q(expires_at__gt=now)


def _open_run(item: Item) -> Run:
    """The item's run, when the item is in the inbox now (a claim on anything else is a 404)."""
    run = Run.objects.filter(run_id=item.run_id).first()
    if run is not None:
        if item.kind in CALL_KINDS:
            calls = Call.objects.in_doubt().filter(run=run, call_id=item.subject)
            found = calls.values_list("receipt_present", "verification").first()
            if found is not None and kinds.call_kind(*found) == item.kind:
                return run
        elif item.kind in kinds.FINDING_KINDS:
            findings = Finding.objects.filter(run=run, subject=item.subject, code__in=kinds.FINDING_KINDS[item.kind],
                                              closed_at__isnull=True)  # fmt: skip
            if findings.exists():
                return run
    raise ClaimError(gettext_noop("This item is not in the inbox (any more): nothing to claim."),
                     status=HTTPStatus.NOT_FOUND)  # fmt: skip


def claim(*, item: Item, user: Any, take_over: bool = False, now: dt.datetime | None = None) -> Claim:
    """``user`` is on ``item`` until ``now`` + ``EVIDENCE_CLAIM_MINUTES``; a claim of their own is
    renewed. Another person's live claim stands unless ``take_over``. Audited."""
    now = now or protocol.utc_now()
    expire(now=now)
    run = _open_run(item)
    name = user.get_username()
    for _ in range(2):  # an insert that meets another's row reads that row, locked, once more
        try:
            with transaction.atomic():
                held = Claim.objects.select_for_update().filter(run=run, kind=item.kind, subject=item.subject).first()
                reason = ""
                if held is not None and held.expires_at <= now:
                    _audit_expiry(held, run)
                    held.delete()
                    held = None
                if held is not None and held.user_id != user.pk:
                    if not take_over:
                        raise ClaimError(gettext_noop("Someone else is on it: take it over only if they agree."),
                                         status=HTTPStatus.CONFLICT, held=held)  # fmt: skip
                    reason = f"taken over from {people.label(held.user_id, held.actor)}, whose claim was live"
                    held.delete()
                    held = None
                if held is None:
                    held = Claim.objects.create(run=run, kind=item.kind, subject=item.subject, actor=name, user=user,
                                                claimed_at=now, expires_at=now + lasts())  # fmt: skip
                else:  # their own: renewed
                    reason = "renewed"
                    Claim.objects.filter(pk=held.pk).update(expires_at=now + lasts())
                    held.expires_at = now + lasts()
                _audit(AuditEntry.CLAIMED, run, item, actor=name, user=user, now=now, reason=reason)
        except IntegrityError:
            continue
        log.info("claimed", extra={"event": AuditEntry.CLAIMED, "run_id": item.run_id, "actor": name})
        return held
    raise ClaimError(gettext_noop("Someone else is on it: take it over only if they agree."),
                     status=HTTPStatus.CONFLICT)  # fmt: skip


def release(*, item: Item, user: Any, now: dt.datetime | None = None) -> None:
    """``user`` lets their claim on ``item`` go. Audited; no claim of theirs is a 409."""
    now = now or protocol.utc_now()
    with transaction.atomic():
        held = (
            Claim.objects.select_for_update()
            .filter(run__run_id=item.run_id, kind=item.kind, subject=item.subject)
            .select_related("run")
            .first()
        )
        if held is None or held.expires_at <= now or held.user_id != user.pk:
            raise ClaimError(gettext_noop("You are not on this item: there is nothing of yours to let go."),
                             status=HTTPStatus.CONFLICT)  # fmt: skip
        held.delete()
        _audit(AuditEntry.CLAIM_RELEASED, held.run, item, actor=user.get_username(), user=user, now=now,
               reason="let go")  # fmt: skip


def acted(*, run: Run, kinds: Iterable[str], subject: str, user: Any, how: str, now: dt.datetime) -> None:
    """Someone settled or triaged the item: whoever was on it is done (inside the act's transaction)."""
    for held in Claim.objects.select_for_update().filter(run=run, kind__in=list(kinds), subject=subject):
        held.delete()
        if held.expires_at <= now:
            _audit_expiry(held, run)
            continue
        mine = held.user_id == user.pk
        reason = how if mine else f"{how} by {people.label(user.pk, user.get_username())}"
        item = Item(held.kind, run.run_id, held.subject)
        _audit(AuditEntry.CLAIM_RELEASED, run, item, actor=held.actor, user=held.user_id, now=now, reason=reason)


def expire(*, now: dt.datetime | None = None) -> int:
    """Remove the claims that ran out, an audit entry each (on the expiry index); how many."""
    now = now or protocol.utc_now()
    count = 0
    with transaction.atomic():
        for held in Claim.objects.select_for_update().filter(expires_at__lte=now).select_related("run")[:500]:
            _audit_expiry(held, held.run)
            held.delete()
            count += 1
    return count


def _audit_expiry(held: Claim, run: Run) -> None:
    minutes = round((held.expires_at - held.claimed_at).total_seconds() / 60)
    item = Item(held.kind, run.run_id, held.subject)
    _audit(AuditEntry.CLAIM_EXPIRED, run, item, actor=held.actor, user=held.user_id, now=held.expires_at,
           reason=f"no act within {minutes} min")  # fmt: skip


def _audit(action: str, run: Run, item: Item, *, actor: str, user: Any, now: dt.datetime, reason: str) -> None:
    user_id = user if isinstance(user, int) else user.pk
    AuditEntry.objects.create(run=run, action=action, subject=f"{item.kind}: {item.subject}"[:450], actor=actor,
                              user_id=user_id, at=now, reason=reason)  # fmt: skip


def live_claims(items: Iterable[Any], now: dt.datetime) -> dict[str, Claim]:
    """The live claims on ``items`` (inbox items, or anything with kind, run_id and subject), by
    ``key_of``: one query on the unique constraint's index, for a page of the kinds."""
    wanted = [(i.kind, i.run_id, i.subject) for i in items if i.run_id and permission_for(i.kind)]
    if not wanted:
        return {}
    match = Q()
    for kind, run_id, subject in wanted:
        match |= Q(kind=kind, run__run_id=run_id, subject=subject)
    rows = Claim.objects.filter(match, _live(now)).select_related("run", "user")
    return {key_of(row.kind, row.run.run_id, row.subject): row for row in rows}


def claim_on_item(item: Item, now: dt.datetime) -> Claim | None:
    """The live claim on ``item``, whatever its run."""
    return (
        Claim.objects.filter(_live(now), run__run_id=item.run_id, kind=item.kind, subject=item.subject)
        .select_related("run", "user")
        .first()
    )


def item_of_call(call: Call) -> Item | None:
    """A call's inbox item, while it is in doubt (its page's claim box)."""
    if not call.in_doubt:
        return None
    return Item(kinds.call_kind(call.receipt_present, call.verification), call.run.run_id, call.call_id)


def item_of_finding(finding: Finding) -> Item | None:
    """A finding's inbox item, while it is open and of a kind the inbox lists (its page's claim box)."""
    kind = next((kind for kind, codes in kinds.FINDING_KINDS.items() if finding.code in codes), None)
    if kind is None or finding.closed_at is not None or finding.run is None:
        return None
    return Item(kind, finding.run.run_id, finding.subject)


def box(item: Item | None, now: dt.datetime) -> dict[str, Any]:
    """What a page's claim box needs: the item, and the live claim on it."""
    return {"claim_item": item, "claim": claim_on_item(item, now) if item is not None else None}


@task()
def expire_claims() -> dict[str, object]:
    """What the worker runs: "I'm on it" claims that ran out, removed, each an audit entry."""
    return {"claims": expire(now=protocol.utc_now())}
