"""Every decision a person made on the dashboard: read-only, filterable, with its twins."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from evidence import downloads, selectors
from evidence.views.common import HtmxHttpRequest, choice, download, download_format, paginate, query_without
from receipts import protocol


@require_GET
def audit(request: HtmxHttpRequest) -> HttpResponse:
    run_id = request.GET.get("run", "")
    actor = request.GET.get("actor", "")
    resolution = choice(request, "resolution", protocol.RESOLUTIONS)
    decisions = selectors.human_decisions(run_id=run_id, actor=actor, resolution=resolution)
    entries = selectors.audit_entries(run_id=run_id, actor=actor)
    listed = choice(request, "list", ("decisions", "actions"), default="decisions")
    fmt = download_format(request)
    if fmt:
        if listed == "actions":
            return download(fmt, "audit-actions", *downloads.action_rows(entries))
        return download(fmt, "audit", *downloads.audit_rows(decisions))
    context = {
        "page": paginate(request, decisions),
        "actions": paginate(request, entries, param="actions_page"),
        "run_id": run_id,
        "actor": actor,
        "resolution": resolution,
        "resolutions": protocol.RESOLUTIONS,
        "query": query_without(request, "page", "format"),
    }
    template = "receipts/audit.html#audit-table" if request.htmx else "receipts/audit.html"
    return render(request, template, context)
