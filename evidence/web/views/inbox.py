"""The inbox: what needs a person, across runs, with the next action on each item."""

from __future__ import annotations

from django.http import HttpResponseBase
from django.shortcuts import render
from django.views.decorators.http import require_GET

from evidence.lib.pagination import cursor_page
from evidence.review import inbox, listings, triage
from evidence.web.views.common import HtmxHttpRequest, choice, download, download_format, query_without, typed
from receipts import protocol
from receipts.findings import ERROR, WARNING


@require_GET
def inbox_page(request: HtmxHttpRequest) -> HttpResponseBase:
    kind = choice(request, "kind", inbox.KINDS)
    severity = choice(request, "severity", (ERROR, WARNING))
    run_id = typed(request, "run")
    view = choice(request, "triage", triage.VIEWS, default=triage.OPEN)
    now = protocol.utc_now()
    listing = listings.inbox(kind=kind, severity=severity, run_id=run_id, view=view, now=now)
    fmt = download_format(request)
    if fmt:
        return download(fmt, listing)
    counts, views = inbox.all_counts(run_id=run_id, now=now)
    context = {
        "page": cursor_page(request, listing.segments, query=query_without(request, "page", "format")),
        # (kind, what the page calls it, how many): the kind stays in the link.
        "counts": [(k, inbox.kind_label(k), n) for k, n in counts.items()],
        "triage_counts": views,
        "views": triage.VIEWS,
        "view": view,
        "kinds": [(k, inbox.kind_label(k)) for k in inbox.KINDS],
        "severities": (ERROR, WARNING),
        "kind": kind,
        "severity": severity,
        "run_id": run_id,
        # An empty page under a filter says how many wait in all, with the way back to them.
        "filtered": bool(kind or severity or run_id or view != triage.OPEN),
        "query": query_without(request, "page", "format"),
    }
    template = "receipts/inbox.html#inbox-list" if request.htmx else "receipts/inbox.html"
    return render(request, template, context)
