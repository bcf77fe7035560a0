"""Findings across runs, and stale reservations and calls (read-only)."""

from __future__ import annotations

from django.http import HttpResponseBase
from django.shortcuts import render
from django.views.decorators.http import require_GET

from evidence import listings, selectors, triage
from evidence.pagination import cursor_page
from evidence.views.common import HtmxHttpRequest, choice, download, download_format, query_without
from receipts import protocol
from receipts.findings import CODES, ERROR, WARNING


@require_GET
def findings(request: HtmxHttpRequest) -> HttpResponseBase:
    code = choice(request, "code", CODES)
    run_id = request.GET.get("run", "")
    severity = choice(request, "severity", (ERROR, WARNING))
    view = choice(request, "triage", triage.VIEWS, default=triage.OPEN)
    listing = listings.findings(code=code, run_id=run_id, severity=severity, view=view)
    fmt = download_format(request)
    if fmt:
        return download(fmt, listing)
    digest_counts, other_counts = selectors.finding_counts()
    # Digest mismatches first: they are the evidence that something was altered. Each list has
    # its own pages; the links keep the other's place.
    digest, other = listing.segments
    digest_page = cursor_page(request, digest, param="digest_page", query=query_without(request, "digest_page"))
    other_page = cursor_page(request, other, param="page", query=query_without(request, "page"))
    context = {
        "digest_counts": digest_counts,
        "other_counts": other_counts,
        "digest_page": digest_page,
        "other_page": other_page,
        "code": code,
        "run_id": run_id,
        "severity": severity,
        "codes": CODES,
        "views": triage.VIEWS,
        "view": view,
        "query": query_without(request, "page", "digest_page", "format"),
    }
    template = "receipts/findings.html#findings-lists" if request.htmx else "receipts/findings.html"
    return render(request, template, context)


@require_GET
def reservations(request: HtmxHttpRequest) -> HttpResponseBase:
    now = protocol.utc_now()
    view = choice(request, "triage", triage.VIEWS, default=triage.OPEN)
    listing = listings.stale(view=view, now=now)
    fmt = download_format(request)
    if fmt:
        return download(fmt, listing)
    page = cursor_page(request, listing.segments, query=query_without(request, "page", "format"))
    context = {"page": page, "now": now, "views": triage.VIEWS, "view": view}
    return render(request, "receipts/reservations.html", context)
