"""Views, one module per page family: parse the request, call one selector, render."""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from evidence.web.metrics import DashboardCollector, may_scrape
from evidence.web.views.api_docs import api_docs
from evidence.web.views.audit import audit
from evidence.web.views.calls import call, confirm, replay, withdraw
from evidence.web.views.claims import claim_action
from evidence.web.views.findings import findings, reservations
from evidence.web.views.hosts import hosts_page
from evidence.web.views.inbox import inbox_page
from evidence.web.views.retention import retention_page
from evidence.web.views.runs import (
    export_download,
    export_panel,
    export_request,
    legal_hold,
    run,
    run_evidence,
    runs,
    search,
)
from evidence.web.views.triage import triage_action, triage_page


@login_not_required
@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


_REGISTRY = CollectorRegistry()  # no auto-describe: it would query the database at import
_REGISTRY.register(DashboardCollector())


@login_not_required  # Prometheus has no login: a token, or this machine only (metrics.may_scrape)
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not may_scrape(request):
        return HttpResponseForbidden(
            "metrics need the token, or a request from this machine\n", content_type="text/plain"
        )
    return HttpResponse(generate_latest(_REGISTRY), content_type=CONTENT_TYPE_PLAIN_0_0_4)


__all__ = [
    "api_docs",
    "audit",
    "call",
    "claim_action",
    "confirm",
    "export_download",
    "export_panel",
    "export_request",
    "findings",
    "healthz",
    "hosts_page",
    "inbox_page",
    "legal_hold",
    "metrics",
    "replay",
    "reservations",
    "retention_page",
    "run",
    "run_evidence",
    "runs",
    "search",
    "triage_action",
    "triage_page",
    "withdraw",
]
