"""Every decision a person made on the dashboard: read-only, filterable, with its twins."""

from __future__ import annotations

from django.http import HttpResponseBase
from django.shortcuts import render
from django.views.decorators.http import require_GET

from evidence.lib.pagination import cursor_page
from evidence.review import listings
from evidence.web.views.common import HtmxHttpRequest, choice, download, download_format, query_without, typed
from receipts import protocol


@require_GET
def audit(request: HtmxHttpRequest) -> HttpResponseBase:
    run_id = typed(request, "run")
    actor = typed(request, "actor")
    resolution = choice(request, "resolution", protocol.RESOLUTIONS)
    decisions = listings.audit_decisions(run_id=run_id, actor=actor, resolution=resolution)
    actions = listings.audit_actions(run_id=run_id, actor=actor)
    listed = choice(request, "list", ("decisions", "actions"), default="decisions")
    fmt = download_format(request)
    if fmt:
        return download(fmt, actions if listed == "actions" else decisions)
    context = {
        "page": cursor_page(request, decisions.segments, query=query_without(request, "page", "format")),
        "actions": cursor_page(
            request, actions.segments, param="actions_page", query=query_without(request, "actions_page", "format")
        ),
        "run_id": run_id,
        "actor": actor,
        "resolution": resolution,
        "resolutions": protocol.RESOLUTIONS,
        "query": query_without(request, "page", "format"),
    }
    template = "receipts/audit.html#audit-table" if request.htmx else "receipts/audit.html"
    return render(request, template, context)
