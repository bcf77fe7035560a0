"""Findings across runs, and stale reservations and calls (read-only)."""

from __future__ import annotations

from django.http import HttpResponseBase
from django.shortcuts import render
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET

from evidence.lib.pagination import cursor_page
from evidence.review import listings, selectors, triage
from evidence.web.views.common import HtmxHttpRequest, choice, download, download_format, query_without, typed
from evidence.words import decision_text, i18n
from receipts import protocol
from receipts.findings import CODES, ERROR, WARNING

# What a resume does with a stale reservation (receipts.recovery.reservation_resume, which
# speaks to programs and stays English in downloads and the API), as the page says it.
RESUME_SAYS = {
    "reused: the first result is returned": gettext_lazy("reused: the first result is returned"),
    "creates the task file under the same task_id, then commits (created)": gettext_lazy(
        "creates the task file under the same task_id, then commits (created)"
    ),
    "adopts the task file it finds (its own) and commits (created)": gettext_lazy(
        "adopts the task file it finds (its own) and commits (created)"
    ),
    "stops with a conflict (task_file_differs): another file holds the task's place": gettext_lazy(
        "stops with a conflict (task_file_differs): another file holds the task's place"
    ),
    "stops with a conflict (task_missing): a created task is never created again": gettext_lazy(
        "stops with a conflict (task_missing): a created task is never created again"
    ),
    "commits (created)": gettext_lazy("commits (created)"),
    "stops with a conflict (task_digest_mismatch)": gettext_lazy("stops with a conflict (task_digest_mismatch)"),
}


def resume_shown(item: selectors.StaleItem) -> SafeString | str:
    """What a resume would do, in the reader's language: a reservation's from RESUME_SAYS, a
    call's as its decision's word and its reason (data); "" when the page shows it as data."""
    if item.kind == "reservation":
        said = RESUME_SAYS.get(item.resume)
        return str(said) if said is not None else ""
    decision, colon, reason = item.resume.partition(": ")
    if item.kind == "call" and colon:
        return format_html("{}: {}", i18n.word(decision), decision_text.reason_shown(reason))
    return ""


@require_GET
def findings(request: HtmxHttpRequest) -> HttpResponseBase:
    code = choice(request, "code", CODES)
    run_id = typed(request, "run")
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
    for item in page.object_list:
        item.resume_shown = resume_shown(item)
    context = {"page": page, "now": now, "views": triage.VIEWS, "view": view}
    return render(request, "receipts/reservations.html", context)
