"""The hosts whose importers ship runs here: their state, heartbeat and what they owe."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponseBase
from django.shortcuts import render
from django.views.decorators.http import require_GET

from evidence.lib.pagination import cursor_page
from evidence.review import listings
from evidence.web.views.common import HtmxHttpRequest, download, download_format, query_without


@require_GET
def hosts_page(request: HtmxHttpRequest) -> HttpResponseBase:
    listing = listings.hosts()
    fmt = download_format(request)
    if fmt:
        return download(fmt, listing)
    context = {
        "page": cursor_page(request, listing.segments, query=query_without(request, "page", "format")),
        "silent_after": settings.EVIDENCE_HOST_SILENT_AFTER_SECONDS,
        "stuck_after": settings.EVIDENCE_SHIP_STUCK_AFTER_SECONDS,
        "this_host": settings.EVIDENCE_HOST_NAME,
    }
    return render(request, "receipts/hosts.html", context)
