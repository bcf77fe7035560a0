"""Every decision a person made on the dashboard: read-only, filterable, with its twins."""

from __future__ import annotations

from django.http import HttpResponseBase
from django.shortcuts import render
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_GET

from evidence import listings
from evidence.models import AuditEntry
from evidence.pagination import cursor_page
from evidence.views.common import HtmxHttpRequest, choice, download, download_format, query_without, typed
from receipts import protocol

# What each action of the audit means, in the reader's language: a tooltip on the action's own
# name, which is shown as it is (the record's word, what downloads and the API say).
ACTION_TITLES = {
    AuditEntry.LEGAL_HOLD_SET: _("legal hold set"),
    AuditEntry.LEGAL_HOLD_LIFTED: _("legal hold lifted"),
    AuditEntry.BODIES_STRIPPED: _("bodies stripped"),
    AuditEntry.RUN_ARCHIVED: _("run archived"),
    AuditEntry.EVIDENCE_EXPORTED: _("evidence exported"),
    AuditEntry.ACKNOWLEDGED: _("finding acknowledged"),
    AuditEntry.UNACKNOWLEDGED: _("acknowledgement undone"),
    AuditEntry.SNOOZED: _("finding snoozed"),
    AuditEntry.UNSNOOZED: _("snooze undone"),
    AuditEntry.TRIAGE_ENDED: _("triage ended by an import"),
    AuditEntry.HOST_MOVED: _("run handed to another host"),
    AuditEntry.HOST_COPY_REMOVED: _("the host's own copy removed after the archive"),
    AuditEntry.PERSON_RENAMED: _("a person's account renamed"),
    AuditEntry.PERSON_REMOVED: _("a person's account removed"),
    AuditEntry.CLAIMED: _("a person said they are on an inbox item"),
    AuditEntry.CLAIM_RELEASED: _("a person is no longer on an inbox item"),
    AuditEntry.CLAIM_EXPIRED: _("a claim on an inbox item ran out"),
}


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
        "action_titles": ACTION_TITLES,
        "query": query_without(request, "page", "format"),
    }
    template = "receipts/audit.html#audit-table" if request.htmx else "receipts/audit.html"
    return render(request, template, context)
