"""Findings across runs, and stale reservations and calls (read-only)."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from evidence import downloads, selectors
from evidence.views.common import HtmxHttpRequest, choice, download, download_format, paginate, query_without
from receipts import protocol
from receipts.findings import CODES, DIGEST_CODES, ERROR, WARNING


@require_GET
def findings(request: HtmxHttpRequest) -> HttpResponse:
    code = choice(request, "code", CODES)
    run_id = request.GET.get("run", "")
    severity = choice(request, "severity", (ERROR, WARNING))
    findings = selectors.open_findings(code=code, run_id=run_id, severity=severity)
    fmt = download_format(request)
    if fmt:
        return download(fmt, "findings", *downloads.finding_rows(findings))
    digest_counts, other_counts = selectors.finding_counts()
    # Digest mismatches first: they are the evidence that something was altered.
    digest_page = paginate(request, findings.filter(code__in=DIGEST_CODES), param="digest_page")
    other_page = paginate(request, findings.exclude(code__in=DIGEST_CODES), param="page")
    context = {
        "digest_counts": digest_counts,
        "other_counts": other_counts,
        "digest_page": digest_page,
        "other_page": other_page,
        "code": code,
        "run_id": run_id,
        "severity": severity,
        "codes": CODES,
        "query": query_without(request, "page", "digest_page", "format"),
    }
    template = "receipts/findings.html#findings-lists" if request.htmx else "receipts/findings.html"
    return render(request, template, context)


@require_GET
def reservations(request: HtmxHttpRequest) -> HttpResponse:
    now = protocol.utc_now()
    items = selectors.stale_items(now=now)
    fmt = download_format(request)
    if fmt:
        return download(fmt, "stale", *downloads.stale_rows(items))
    page = paginate(request, items)
    return render(request, "receipts/reservations.html", {"page": page, "now": now})
