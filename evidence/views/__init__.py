"""Views, one module per page family: parse the request, call one selector, render."""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from evidence.views.audit import audit
from evidence.views.calls import call, confirm, replay
from evidence.views.findings import findings, reservations
from evidence.views.inbox import inbox_page
from evidence.views.retention import retention_page
from evidence.views.runs import legal_hold, run, run_evidence, runs, search


@login_not_required
@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


__all__ = [
    "audit",
    "call",
    "confirm",
    "findings",
    "healthz",
    "inbox_page",
    "legal_hold",
    "replay",
    "reservations",
    "retention_page",
    "run",
    "run_evidence",
    "runs",
    "search",
]
