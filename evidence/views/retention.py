"""Each run's retention plan: keep (and why), strip bodies on a date, archive on a date."""

from __future__ import annotations

from django.http import HttpResponseBase
from django.shortcuts import render
from django.views.decorators.http import require_GET

from evidence import listings, retention
from evidence.pagination import cursor_page
from evidence.views.common import HtmxHttpRequest, choice, download, download_format, query_without
from receipts import protocol


@require_GET
def retention_page(request: HtmxHttpRequest) -> HttpResponseBase:
    action = choice(request, "action", retention.ACTIONS)
    blocked = choice(request, "blocked", ("1",))
    policy = retention.RetentionPolicy.from_settings()
    now = protocol.utc_now()
    listing = listings.retention(policy=policy, now=now, action=action, blocked=bool(blocked))
    fmt = download_format(request)
    if fmt:
        return download(fmt, listing)
    context = {
        "page": cursor_page(request, listing.segments, query=query_without(request, "page", "format")),
        "totals": retention.plan_totals(policy=policy, now=now),
        "policy": policy,
        "actions": retention.ACTIONS,
        "action": action,
        "blocked": blocked,
        "query": query_without(request, "page", "format"),
    }
    template = "receipts/retention.html#retention-table" if request.htmx else "receipts/retention.html"
    return render(request, template, context)
