"""The JSON API: what the pages show, for scripts (``/api/``).

django-ninja (maintained, Django-native) gives typed schemas and the OpenAPI
description from the same code (``/api/openapi.json``); its interactive docs are
the page ``/api/docs`` (Swagger UI from django-ninja's own files, no CDN). Every list is a GET, reads through the same
selectors as the pages, pages long lists by key (``?cursor=`` from the previous
page's ``next``), and needs a login that may browse: a session (the dashboard's
cookie) or ``Authorization: Bearer <token>`` (``manage.py api_token``).

One endpoint writes: a finding's triage (``POST /api/findings/{id}/triage``), for a
login with the triage permission (``evidence.lib.roles``), with the page's rules
(``evidence.review.triage.act``); a session's POST carries its CSRF token, a token's does not.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
import secrets
from collections.abc import Callable
from types import GenericAlias
from typing import Annotated, Any

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.models import User
from django.core.exceptions import BadRequest
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.urls import URLPattern
from django.utils import timezone
from ninja import NinjaAPI, Schema
from ninja.errors import HttpError
from ninja.security import HttpBearer, SessionAuth
from pydantic import StringConstraints, WithJsonSchema

from evidence.lib.pagination import cursor_page
from evidence.lib.roles import BROWSE, TRIAGE
from evidence.models import ApiToken, Finding, Run
from evidence.retention import plans
from evidence.review import inbox, listings, selectors, triage
from evidence.web.views.common import choice, typed
from receipts import protocol
from receipts.findings import CODES, ERROR, WARNING

MAX_LIMIT = 200


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def password_fingerprint(user: User) -> str:
    """What changes when the user's password does (its stored hash, digested again)."""
    return hashlib.sha256(user.password.encode()).hexdigest()


def new_token(*, user: User, name: str, expires_at: dt.datetime | None = None) -> str:
    """A new token for ``user``: shown once; only its digest is kept. It ends at ``expires_at``
    (if given), when the user's password changes, or when the user is deactivated."""
    token = "cp_" + secrets.token_urlsafe(32)
    ApiToken.objects.create(
        user=user, name=name, digest=token_digest(token), created_at=timezone.now(), expires_at=expires_at,
        password_fingerprint=password_fingerprint(user),
    )  # fmt: skip
    return token


def _may_browse(user: User | None) -> User | None:
    if user is None or not user.is_active:
        return None
    if not user.has_perm(BROWSE):
        raise HttpError(403, "this login has no role on the dashboard: ask an admin for one")
    return user


class BearerToken(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> User | None:
        found = ApiToken.objects.select_related("user").filter(digest=token_digest(token)).first()
        if found is None:
            return None
        if found.expires_at is not None and found.expires_at <= timezone.now():
            return None
        if not hmac.compare_digest(found.password_fingerprint, password_fingerprint(found.user)):
            return None  # the password changed since: every token of the old one has ended
        ApiToken.objects.filter(pk=found.pk).update(last_used_at=timezone.now())
        request.user = found.user
        return _may_browse(found.user)


class Session(SessionAuth):
    def authenticate(self, request: HttpRequest, key: str | None) -> User | None:
        return _may_browse(super().authenticate(request, key))


def _for_browsers_only(view: Callable) -> Callable:
    """The OpenAPI description behind the same door as the endpoints it describes."""

    @functools.wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            allowed = any(auth(request) for auth in AUTH)
        except HttpError as refused:
            return JsonResponse({"detail": str(refused)}, status=refused.status_code)
        if not allowed:
            return JsonResponse({"detail": "Unauthorized"}, status=401)
        return view(request, *args, **kwargs)

    return guarded


AUTH = [BearerToken(), Session()]
api = NinjaAPI(
    title="Callproof", version="1", description=__doc__, urls_namespace="api", docs_url=None,
    auth=AUTH, docs_decorator=_for_browsers_only,
)  # fmt: skip


@api.exception_handler(BadRequest)
def bad_request(request: HttpRequest, error: BadRequest) -> HttpResponse:
    """The pages' 400s (a filter value, a page cursor: ``choice``, ``cursor_page``), in JSON."""
    return api.create_response(request, {"detail": str(error)}, status=400)


# A time as the twins give it (``listings.json_value``: ISO 8601 to the microsecond), not as
# pydantic would write it again (to the millisecond).
Moment = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]

# One schema an item, field for field the list's (``evidence.review.listings``): the API answers one
# page of the items the CSV and JSON twins hold in full (a test holds the two to each other).


class RunOut(Schema):
    run_id: str
    state: str
    attempts: int | None
    verdict: str
    first_event_at: Moment | None
    last_event_at: Moment | None
    events: int
    calls: int
    calls_by_status: dict[str, int]
    in_doubt: int
    stale_reservations: int
    open_findings: int
    archived: bool
    legal_hold: bool


class EventOut(Schema):
    seq: int
    ts: Moment | None
    type: str
    call_id: str
    client_submission_id: str
    disposition: str
    payload: Any


class CallOut(Schema):
    call_id: str
    # As a page shows it: "tampered" or "unverified" for a receipt that fails its check,
    # "settled: committed" or "settled: rejected" for a call a person settled (``settled_by``).
    status: str
    written_status: str
    tool: str
    tool_version: str
    attempt: int | None
    verification: str
    decision: str
    decision_reason: str
    created_at: Moment | None
    updated_at: Moment | None
    settled_by: str
    # The host whose file settled it when no decision made on the dashboard did: then
    # ``settled_by`` is the name that file gives, the host's word, not a dashboard account.
    settled_on_host: str


class SubmissionOut(Schema):
    client_submission_id: str
    state: str
    task_id: str
    request_digest: str
    task_present: bool
    updated_at: Moment | None


class DecisionOut(Schema):
    call_id: str
    status: str
    tool: str
    decision: str
    decision_reason: str


# A finding's triage (evidence/review/triage.py): its state ("" when open), who, when, why, until when.
TRIAGE_ANNOTATIONS = {"triage": str, "triage_by": str, "triage_at": Moment | None, "triage_reason": str,
                      "triage_until": Moment | None, "triage_on_change": bool}  # fmt: skip


def with_triage(item: type[Schema]) -> type[Schema]:
    """``item``'s fields, then a finding's triage, in the lists' order (``listings.TRIAGE_FIELDS``)."""
    return type(item.__name__.lstrip("_"), (item,), {"__annotations__": TRIAGE_ANNOTATIONS})


class _FindingOut(Schema):
    run_id: str | None
    code: str
    severity: str
    subject: str
    detail: str
    call_id: str
    stored_value: str
    recomputed_value: str
    first_seen: Moment
    finding_id: int


FindingOut = with_triage(_FindingOut)


class _StaleOut(Schema):
    kind: str
    run_id: str
    subject: str
    state: str
    since: Moment | None
    task_present: bool | None
    digests_match: bool | None
    resume: str
    finding_id: int | None


StaleOut = with_triage(_StaleOut)


class _InboxOut(Schema):
    kind: str
    severity: str
    since: Moment | None
    run_id: str
    subject: str
    detail: str
    action: str
    code: str
    finding_id: int | None  # a finding's (what triage acts on); null for a call in doubt or a host
    stored_value: str
    recomputed_value: str


InboxOut = with_triage(_InboxOut)


class HumanDecisionOut(Schema):
    decided_at: Moment
    actor: str  # the name then
    actor_id: int | None  # the person's id, which no rename changes
    run_id: str
    call_id: str
    resolution: str
    reason: str
    receipt_sha256: str


class ActionOut(Schema):
    at: Moment
    actor: str
    actor_id: int | None  # null: a command acted
    run_id: str  # empty for an act on a person
    action: str
    reason: str
    subject: str


class TriageIn(Schema):
    """What the triage page's form says: the act, its reason, and for a snooze until when
    (``until``, a time) or until it changes (``on_change``), or both."""

    # The description names the acts; an act it does not name is the service's 400, which lists them.
    action: Annotated[str, WithJsonSchema({"type": "string", "enum": list(triage.ACTIONS)})]
    # The form's limit, and no NUL (PostgreSQL's text refuses it): a 422 that says which field.
    reason: Annotated[str, StringConstraints(max_length=triage.REASON_LIMIT, pattern="^[^\x00]*$")]
    until: dt.datetime | None = None
    on_change: bool = False


class PlanOut(Schema):
    run_id: str
    action: str
    reason: str
    blockers: list[str]
    clock_from: Moment | None
    strip_on: Moment | None
    archive_on: Moment | None
    body_bytes: int


class HostOut(Schema):
    name: str
    state: str  # shipping, silent, stopped, one-off
    runs_root: str
    version: str
    started_at: Moment
    last_seen_at: Moment
    last_pass_seconds: float | None
    stopped_at: Moment | None
    awaiting_delivery: int
    oldest_undelivered_at: Moment | None  # when the oldest decision still to deliver was made
    failing_delivery: int  # decisions still to deliver whose last try failed
    refused_deliveries: int  # decisions its run directories refused
    last_error: str  # its watch's last failed pass ("" when none)
    last_error_at: Moment | None
    clock_offset_seconds: float | None  # its clock less the server's, as its shipper last measured it
    runs_not_arriving: int  # shipped runs stuck past EVIDENCE_SHIP_STUCK_AFTER_SECONDS
    pushes_refused_since: Moment | None  # every push of it refused since then (none taken)
    push_refusal: str  # the last refusal, said


def paged(item: type[Schema]) -> type[Schema]:
    """A page of ``item``s: the same shape as a list's JSON twin, which holds every item."""
    return type(f"{item.__name__.removesuffix('Out')}Page", (Schema,), {
        # GenericAlias(list, item) is list[item], spelled as the value it is here, not as a type.
        "__annotations__": {"items": GenericAlias(list, item), "next": str | None, "total": int | None},
    })  # fmt: skip


def _page(request: HttpRequest, listing: listings.Listing, limit: int) -> dict:
    """One page by key: its items and the ``next`` cursor (null on the last page)."""
    if not 1 <= limit <= MAX_LIMIT:
        raise HttpError(400, f"limit must be from 1 to {MAX_LIMIT}")
    page = cursor_page(request, listing.segments, param="cursor", per_page=limit, total=listing.total)
    return {"items": [listing.item(row) for row in page.object_list], "next": page.older, "total": listing.total}


def _run(run_id: str) -> Run:
    return get_object_or_404(Run, run_id=run_id)


@api.get("/runs", response=paged(RunOut), summary="Runs, the most recent activity first")
def runs(request: HttpRequest, state: str = "", attention: bool = False, limit: int = 50):
    choice(request, "state", selectors.run_facets().states)
    return _page(request, listings.runs(state=state, attention=attention), limit)


@api.get("/runs/{run_id}", response=RunOut, summary="One run: its counts as the run page shows them")
def run(request: HttpRequest, run_id: str):
    return listings.run_item(_run(run_id))


@api.get("/runs/{run_id}/events", response=paged(EventOut), summary="A run's ledger, newest first")
def events(request: HttpRequest, run_id: str, type: str = "", limit: int = 50):
    found = _run(run_id)
    choice(request, "type", selectors.event_types(run=found))
    return _page(request, listings.events(run=found, event_type=type), limit)


@api.get("/runs/{run_id}/calls", response=paged(CallOut), summary="A run's calls, by call_id")
def calls(request: HttpRequest, run_id: str, limit: int = 50):
    return _page(request, listings.calls(run=_run(run_id)), limit)


@api.get("/runs/{run_id}/submissions", response=paged(SubmissionOut), summary="A run's submissions")
def submissions(request: HttpRequest, run_id: str, limit: int = 50):
    return _page(request, listings.submissions(run=_run(run_id)), limit)


@api.get("/runs/{run_id}/decisions", response=paged(DecisionOut), summary="What a resume would do with each call")
def decisions(request: HttpRequest, run_id: str, decision: str = "", limit: int = 50):
    choice(request, "decision", protocol.DECISIONS)
    return _page(request, listings.decisions(run=_run(run_id), decision=decision), limit)


def _view(request: HttpRequest) -> str:
    return choice(request, "triage", triage.VIEWS, default=triage.OPEN)


@api.get("/findings", response=paged(FindingOut), summary="Open findings: digest mismatches first, by code")
def findings(
    request: HttpRequest, code: str = "", run_id: str = "", severity: str = "", triage: str = "", limit: int = 50
):
    choice(request, "code", CODES)
    choice(request, "severity", (ERROR, WARNING))
    typed(request, "run_id")
    return _page(request, listings.findings(code=code, run_id=run_id, severity=severity, view=_view(request)), limit)


@api.get("/reservations", response=paged(StaleOut), summary="Stale reservations and calls, as they went stale")
def reservations(request: HttpRequest, triage: str = "", limit: int = 50):
    return _page(request, listings.stale(view=_view(request)), limit)


@api.get("/inbox", response=paged(InboxOut), summary="What needs a person, most serious first")
def inbox_items(
    request: HttpRequest, kind: str = "", severity: str = "", run_id: str = "", triage: str = "", limit: int = 50
):
    choice(request, "kind", inbox.KINDS)
    choice(request, "severity", (ERROR, WARNING))
    typed(request, "run_id")
    return _page(request, listings.inbox(kind=kind, severity=severity, run_id=run_id, view=_view(request)), limit)


@api.post("/findings/{finding_id}/triage", response=FindingOut, summary="Acknowledge or snooze a finding, or undo it")
def triage_finding(request: HttpRequest, finding_id: int, body: TriageIn):
    user = request.user
    if not isinstance(user, User) or not user.has_perm(TRIAGE):
        raise HttpError(403, "triage needs the confirmer role")
    if settings.EVIDENCE_READ_ONLY:
        raise HttpError(403, "this deployment only browses")
    finding = get_object_or_404(Finding, pk=finding_id, run__isnull=False)
    if body.until is not None and body.until.tzinfo is None:
        raise HttpError(400, "until: give the time with its zone (2026-12-03T12:00:00Z)")
    try:
        acted = triage.act(finding=finding, user=user, action=body.action, reason=body.reason, until=body.until,
                                on_change=body.on_change, now=protocol.utc_now())  # fmt: skip
    except triage.TriageError as refused:
        field = f"{refused.field}: " if refused.field else ""
        raise HttpError(refused.status, field + refused.message) from None
    listing = listings.findings()
    return listing.item(triage.as_shown([Finding.objects.select_related("run").get(pk=acted.pk)],
                                             protocol.utc_now())[0])  # fmt: skip


@api.get("/audit", response=paged(HumanDecisionOut), summary="Decisions people made on the dashboard, newest first")
def audit(request: HttpRequest, run_id: str = "", actor: str = "", resolution: str = "", limit: int = 50):
    choice(request, "resolution", protocol.RESOLUTIONS)
    typed(request, "run_id")
    typed(request, "actor")
    return _page(request, listings.audit_decisions(run_id=run_id, actor=actor, resolution=resolution), limit)


@api.get("/audit/actions", response=paged(ActionOut), summary="Legal holds, retention and exports, newest first")
def audit_actions(request: HttpRequest, run_id: str = "", actor: str = "", limit: int = 50):
    typed(request, "run_id")
    typed(request, "actor")
    return _page(request, listings.audit_actions(run_id=run_id, actor=actor), limit)


@api.get("/retention", response=paged(PlanOut), summary="Each run's retention plan, by run_id")
def retention(request: HttpRequest, action: str = "", blocked: bool = False, limit: int = 50):
    choice(request, "action", plans.ACTIONS)
    listing = listings.retention(
        policy=plans.RetentionPolicy.from_settings(), now=protocol.utc_now(), action=action, blocked=blocked
    )
    return _page(request, listing, limit)


@api.get("/hosts", response=paged(HostOut), summary="The hosts that ship runs here, by name")
def hosts(request: HttpRequest, limit: int = 50):
    return _page(request, listings.hosts(), limit)


def urls() -> tuple:
    """The API's URLs, which answer for themselves: no login page for a script (a 401 instead),
    and the roles check is the API's own (a 403)."""
    patterns, app_name, namespace = api.urls
    for pattern in patterns:
        assert isinstance(pattern, URLPattern)  # each of the API's URLs is a view, none an include()
        login_not_required(pattern.callback)
    return patterns, app_name, namespace
