"""Each run's retention plan: keep (and why), strip bodies on a date, archive on a date."""

from __future__ import annotations

from django.http import HttpResponseBase
from django.shortcuts import render
from django.views.decorators.http import require_GET

from evidence.lib.pagination import cursor_page
from evidence.retention import plans
from evidence.review import listings
from evidence.web.views.common import HtmxHttpRequest, choice, download, download_format, query_without
from receipts import protocol


@require_GET
def retention_page(request: HtmxHttpRequest) -> HttpResponseBase:
    action = choice(request, "action", plans.ACTIONS)
    blocked = choice(request, "blocked", ("1",))
    policy = plans.RetentionPolicy.from_settings()
    now = protocol.utc_now()
    listing = listings.retention(policy=policy, now=now, action=action, blocked=bool(blocked))
    fmt = download_format(request)
    if fmt:
        return download(fmt, listing)
    context = {
        "page": cursor_page(request, listing.segments, query=query_without(request, "page", "format")),
        "totals": plans.plan_totals(policy=policy, now=now),
        "policy": policy,
        "actions": plans.ACTIONS,
        "action": action,
        "blocked": blocked,
        "query": query_without(request, "page", "format"),
    }
    template = "receipts/retention.html#retention-table" if request.htmx else "receipts/retention.html"
    return render(request, template, context)
