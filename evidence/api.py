"""The read-only JSON API: what the pages show, for scripts (``/api/``).

django-ninja (maintained, Django-native) gives typed schemas and the OpenAPI
description from the same code (``/api/openapi.json``); its interactive docs page
is off, because it loads scripts from a CDN that the Content-Security-Policy and
a closed network both refuse. Every endpoint is a GET, reads through the same
selectors as the pages, pages long lists by key (``?cursor=`` from the previous
page's ``next``), and needs a login that may browse: a session (the dashboard's
cookie) or ``Authorization: Bearer <token>`` (``manage.py api_token``).
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
import secrets
from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import BadRequest
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone
from ninja import NinjaAPI, Schema
from ninja.errors import HttpError
from ninja.security import HttpBearer, SessionAuth

from evidence import inbox, selectors
from evidence.models import ApiToken, Call, Run
from evidence.pagination import cursor_page
from evidence.roles import BROWSE
from evidence.stats import RunSummary
from evidence.views.common import choice
from receipts import protocol
from receipts.findings import CODES, ERROR, WARNING

MAX_LIMIT = 200


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def password_fingerprint(user: AbstractBaseUser) -> str:
    """What changes when the user's password does (its stored hash, digested again)."""
    return hashlib.sha256(user.password.encode()).hexdigest()


def new_token(*, user: AbstractBaseUser, name: str, expires_at: dt.datetime | None = None) -> str:
    """A new token for ``user``: shown once; only its digest is kept. It ends at ``expires_at``
    (if given), when the user's password changes, or when the user is deactivated."""
    token = "cp_" + secrets.token_urlsafe(32)
    ApiToken.objects.create(
        user=user, name=name, digest=token_digest(token), created_at=timezone.now(), expires_at=expires_at,
        password_fingerprint=password_fingerprint(user),
    )  # fmt: skip
    return token


def _may_browse(user: AbstractBaseUser | None) -> AbstractBaseUser | None:
    if user is None or not user.is_active:
        return None
    if not user.has_perm(BROWSE):
        raise HttpError(403, "this login has no role on the dashboard: ask an admin for one")
    return user


class BearerToken(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> AbstractBaseUser | None:
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
    def authenticate(self, request: HttpRequest, key: str | None) -> AbstractBaseUser | None:
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


class RunOut(Schema):
    run_id: str
    state: str
    attempts: int | None
    verdict: str
    events: int
    calls: int
    in_doubt: int
    open_findings: int
    stale_reservations: int
    first_event_at: dt.datetime | None
    last_event_at: dt.datetime | None
    archived: bool
    legal_hold: bool


class CallOut(Schema):
    call_id: str
    status: str  # as a page shows it: "tampered" or "unverified" for a receipt that fails its check
    written_status: str
    tool: str
    attempt: int | None
    verification: str
    decision: str
    decision_reason: str
    created_at: dt.datetime | None
    updated_at: dt.datetime | None


class FindingOut(Schema):
    run_id: str | None
    code: str
    severity: str
    subject: str
    detail: str
    call_id: str
    stored_value: str
    recomputed_value: str
    first_seen: dt.datetime


class ReservationOut(Schema):
    kind: str
    run_id: str
    subject: str
    state: str
    since: dt.datetime | None
    task_present: bool | None
    digests_match: bool | None
    resume: str


class InboxOut(Schema):
    kind: str
    severity: str
    since: dt.datetime | None
    run_id: str
    subject: str
    detail: str
    code: str


class DecisionOut(Schema):
    run_id: str
    call_id: str
    resolution: str
    reason: str
    actor: str
    decided_at: dt.datetime


def _run_out(run: Run) -> RunOut:
    summary = RunSummary.of(run)
    return RunOut(
        run_id=run.run_id, state=run.state, attempts=run.attempts, verdict=summary.verdict, events=run.event_count,
        calls=summary.calls, in_doubt=summary.in_doubt, open_findings=summary.open_findings,
        stale_reservations=summary.stale_reservations, first_event_at=run.first_event_at,
        last_event_at=run.last_event_at, archived=run.archived, legal_hold=run.legal_hold,
    )  # fmt: skip


def _call_out(call: Call) -> CallOut:
    return CallOut(
        call_id=call.call_id, status=call.shown_status, written_status=call.status, tool=call.tool,
        attempt=call.attempt, verification=call.verification, decision=call.decision,
        decision_reason=call.decision_reason, created_at=call.created_at, updated_at=call.updated_at,
    )  # fmt: skip


def _page(request: HttpRequest, items, *, keys, limit: int, total: int | None, out) -> dict:
    """One page by key: ``items`` and the ``next`` cursor (null on the last page)."""
    if not 1 <= limit <= MAX_LIMIT:
        raise HttpError(400, f"limit must be from 1 to {MAX_LIMIT}")
    page = cursor_page(request, items, keys=keys, param="cursor", per_page=limit, total=total)
    return {"items": [out(item) for item in page.object_list], "next": page.older, "total": total}


class RunPage(Schema):
    items: list[RunOut]
    next: str | None
    total: int | None


class CallPage(Schema):
    items: list[CallOut]
    next: str | None
    total: int | None


class FindingPage(Schema):
    items: list[FindingOut]
    next: str | None
    total: int | None


class DecisionPage(Schema):
    items: list[DecisionOut]
    next: str | None
    total: int | None


@api.get("/runs", response=RunPage, summary="Runs, by run_id")
def runs(request: HttpRequest, state: str = "", attention: bool = False, limit: int = 50):
    choice(request, "state", selectors.run_states())
    items = selectors.runs_list(state=state, attention=attention).order_by("run_id")
    return _page(request, items, keys=("run_id",), limit=limit, total=None, out=_run_out)


@api.get("/runs/{run_id}", response=RunOut, summary="One run: its counts as the run page shows them")
def run(request: HttpRequest, run_id: str):
    return _run_out(get_object_or_404(Run, run_id=run_id))


@api.get("/runs/{run_id}/calls", response=CallPage, summary="A run's calls, by call_id")
def calls(request: HttpRequest, run_id: str, limit: int = 50):
    found = get_object_or_404(Run, run_id=run_id)
    total = RunSummary.of(found).calls
    return _page(request, selectors.run_calls(run=found), keys=("call_id",), limit=limit, total=total, out=_call_out)


@api.get("/findings", response=FindingPage, summary="Open findings across runs, newest first")
def findings(request: HttpRequest, code: str = "", run_id: str = "", severity: str = "", limit: int = 50):
    choice(request, "code", CODES)
    choice(request, "severity", (ERROR, WARNING))
    items = selectors.open_findings(code=code, run_id=run_id, severity=severity)
    return _page(
        request, items, keys=("-id",), limit=limit, total=None,
        out=lambda f: FindingOut(run_id=f.run.run_id if f.run else None, code=f.code, severity=f.severity,
                                 subject=f.subject, detail=f.detail, call_id=f.call_id, stored_value=f.stored_value,
                                 recomputed_value=f.recomputed_value, first_seen=f.first_seen),
    )  # fmt: skip


@api.get("/reservations", response=list[ReservationOut], summary="Stale reservations and stale calls, oldest first")
def reservations(request: HttpRequest):
    return [item.__dict__ for item in selectors.stale_items(now=protocol.utc_now())]


@api.get("/inbox", response=list[InboxOut], summary="What needs a person, most serious first (1,000 of each kind)")
def inbox_items(request: HttpRequest, kind: str = "", severity: str = "", run_id: str = ""):
    choice(request, "kind", inbox.KINDS)
    choice(request, "severity", (ERROR, WARNING))
    return [item.__dict__ for item in inbox.inbox_items(kind=kind, severity=severity, run_id=run_id)]


@api.get("/audit", response=DecisionPage, summary="Decisions people made on the dashboard, newest first")
def audit(request: HttpRequest, run_id: str = "", actor: str = "", limit: int = 50):
    items = selectors.human_decisions(run_id=run_id, actor=actor)
    return _page(
        request, items, keys=("-id",), limit=limit, total=None,
        out=lambda d: DecisionOut(run_id=d.run.run_id, call_id=d.call_id, resolution=d.resolution, reason=d.reason,
                                  actor=d.actor, decided_at=d.decided_at),
    )  # fmt: skip


def urls() -> tuple:
    """The API's URLs, which answer for themselves: no login page for a script (a 401 instead),
    and the roles check is the API's own (a 403)."""
    patterns, app_name, namespace = api.urls
    for pattern in patterns:
        pattern.callback.login_required = False
    return patterns, app_name, namespace
