"""Each run's retention plan: keep (and why), strip bodies on a date, archive on a date."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from evidence import downloads, retention
from evidence.views.common import HtmxHttpRequest, choice, download, download_format, paginate, query_without
from receipts import protocol


@require_GET
def retention_page(request: HtmxHttpRequest) -> HttpResponse:
    action = choice(request, "action", retention.ACTIONS)
    blocked = choice(request, "blocked", ("1",))
    policy = retention.RetentionPolicy.from_settings()
    plans = retention.plan_runs(policy=policy, now=protocol.utc_now())
    totals = retention.plan_totals(plans)
    shown = [plan for plan in plans if (not action or plan.action == action) and (not blocked or plan.blockers)]
    fmt = download_format(request)
    if fmt:
        return download(fmt, "retention", *downloads.retention_rows(shown))
    context = {
        "page": paginate(request, shown),
        "totals": totals,
        "policy": policy,
        "actions": retention.ACTIONS,
        "action": action,
        "blocked": blocked,
        "query": query_without(request, "page", "format"),
    }
    template = "receipts/retention.html#retention-table" if request.htmx else "receipts/retention.html"
    return render(request, template, context)
