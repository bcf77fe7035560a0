"""The runs list, one run, the search box."""

from __future__ import annotations

from http import HTTPStatus
from pathlib import Path

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import FileResponse, HttpResponse, HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from evidence.export import jobs
from evidence.lib.pagination import cursor_page, first_rows
from evidence.lib.roles import requires
from evidence.models import Export, Run
from evidence.retention import actions
from evidence.review import listings, selectors
from evidence.web.forms import LegalHoldForm
from evidence.web.views.common import (
    HtmxHttpRequest,
    choice,
    download,
    download_format,
    get_run_or_404,
    query_without,
    see_other,
    typed,
    url_of,
    whole_number,
)
from receipts import protocol

INBOX_ON_HOME = 5


@require_GET
def runs(request: HtmxHttpRequest) -> HttpResponseBase:
    facets = selectors.run_facets()
    state = choice(request, "state", facets.states)
    attention = request.GET.get("attention") == "1"
    listing = listings.runs(state=state, attention=attention)
    fmt = download_format(request)
    if fmt:
        return download(fmt, listing)
    query = query_without(request, "page", "format")
    page = cursor_page(request, listing.segments, total=facets.total(state=state, attention=attention), query=query)
    times = [t for run, _ in page.object_list for t in (run.first_event_at, run.last_event_at) if t]
    context = {
        "page": page,
        "rows": page.object_list,
        "states": facets.states,
        "state": state,
        "attention": attention,
        "span": (min(times), max(times)) if times else None,
        "totals": {"runs": facets.runs, "attention": facets.attention},
        "query": query,
    }
    if not request.htmx:
        # The home page starts with what needs a person, when anything does.
        context["inbox_first"] = first_rows(listings.inbox().segments, INBOX_ON_HOME)
    template = "receipts/runs.html#runs-table" if request.htmx else "receipts/runs.html"
    return render(request, template, context)


@require_GET
def search(request: HtmxHttpRequest) -> HttpResponse:
    query = typed(request, "q")
    matches = selectors.search(query=query)
    if len(matches) == 1:
        return redirect(url_of(matches[0].kind, matches[0].run_id, matches[0].key))
    context = {"q": query, "matches": matches, "scanned": selectors.ARGUMENTS_SCANNED}
    return render(request, "receipts/search.html", context)


@require_GET
def run(request: HtmxHttpRequest, run_id: str) -> HttpResponseBase:
    run = get_run_or_404(run_id)
    event_type = choice(request, "type", selectors.event_types(run=run))
    fmt = download_format(request)
    submission_filter = typed(request, "submission")
    lists = {
        "events": lambda: listings.events(run=run, event_type=event_type),
        "calls": lambda: listings.calls(run=run),
        "submissions": lambda: listings.submissions(run=run, client_submission_id=submission_filter),
    }
    if fmt:
        return download(fmt, lists[choice(request, "list", lists, default="events")]())
    ledger_query = query_without(request, "page", "format", "seq")
    ledger = lists["events"]()
    timeline = cursor_page(
        request,
        listings.newest_first(ledger),
        total=ledger.total,
        query=ledger_query,
        start=[seq] if (seq := whole_number(request, "seq")) is not None else None,
    )
    timeline_context = {
        "run": run,
        "timeline": timeline,
        # Receipt events of calls whose receipt fails its check: never shown as what they say.
        "unproven": selectors.unproven_calls(run=run, events=timeline.object_list),
        "live": run.is_live and timeline.is_first,
        "event_type": event_type,
        "query": ledger_query,
    }
    if request.htmx and request.htmx.target == "timeline":  # a filter or a ledger page
        return render(request, "receipts/run.html#timeline", timeline_context)
    summary = selectors.run_summaries(runs=[run])[run.pk]
    call_list, submission_list = lists["calls"](), lists["submissions"]()
    calls = cursor_page(
        request,
        call_list.segments,
        param="calls_page",
        total=call_list.total,
        query=query_without(request, "calls_page", "format"),
    )
    submissions = cursor_page(
        request,
        submission_list.segments,
        param="submissions_page",
        total=submission_list.total,
        query=query_without(request, "submissions_page", "format"),
    )
    history = selectors.disposition_history(
        run=run, submission_ids=[s.client_submission_id for s in submissions.object_list]
    )
    reuse = selectors.reuse_counts(run=run, call_ids=[c.call_id for c in calls.object_list])
    context = timeline_context | {
        "summary": summary,
        "needs": selectors.run_needs(run=run, summary=summary),
        "histogram": selectors.events_histogram(run=run),
        "event_types": selectors.event_types(run=run),
        "calls": calls,
        "call_rows": [(call, reuse.get(call.call_id, 0)) for call in calls.object_list],
        "submissions": submissions,
        "submission_filter": submission_filter,
        "submission_rows": [(s, history.get(s.client_submission_id, [])) for s in submissions.object_list],
        "legacy": selectors.legacy_submissions(run=run)[:50],
        "findings": selectors.run_open_findings(run=run),
        "read_only": settings.EVIDENCE_READ_ONLY,
        "hold_form": LegalHoldForm(initial={"hold": "lift" if run.legal_hold else "set"}, auto_id="hold-%s"),
        "exports": jobs.recent(run) if request.user.has_perm("receipts.export_evidence") else None,
    }
    # The live refresh swaps the whole body: summary, charts, ledger, calls and decisions.
    template = "receipts/run.html#run-body" if request.htmx else "receipts/run.html"
    return render(request, template, context)


@require_POST
@requires("receipts.export_evidence")
def export_request(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Queue an export of the run's redacted evidence for the worker, and answer at once: the
    exports panel (htmx), or back to the run page; a refusal is said there, nothing queued."""
    run = get_run_or_404(run_id)
    try:
        jobs.request_export(run=run, user=request.user)
    except jobs.ExportRefused as refusal:
        refused: jobs.ExportRefused | None = refusal
    else:
        refused = None
    if request.htmx:
        context = {"run": run, "exports": jobs.recent(run), "refused": refused}
        return render(request, "receipts/run.html#exports", context)
    if refused is not None:  # said on the run page it goes back to, worded by the panel's own template
        messages.error(request, render_to_string("receipts/_export_refused.html", {"refused": refused}, request))
    return see_other(reverse("run", args=[run.run_id]) + "#exports")


@require_GET
@requires("receipts.export_evidence")
def export_panel(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """The run's newest exports, with their progress: what the run page polls while one runs."""
    run = get_run_or_404(run_id)
    # Polled by htmx, the panel alone; opened as an address (a bookmark, a new tab), a page.
    template = "receipts/run.html#exports" if request.htmx else "receipts/exports.html"
    return render(request, template, {"run": run, "exports": jobs.recent(run)})


@require_GET
@requires("receipts.export_evidence")
def export_download(request: HtmxHttpRequest, run_id: str, export_id: int) -> HttpResponseBase:
    """A finished export's zip, streamed from EVIDENCE_EXPORT_ROOT."""
    export = get_object_or_404(Export, pk=export_id, run__run_id=run_id)
    return _zip_response(request, jobs.ready_file(export), export.run)


@require_GET
@requires("receipts.export_evidence")
def run_evidence(request: HtmxHttpRequest, run_id: str) -> HttpResponseBase:
    """The run's newest finished export (the stable link); exports are asked for on the run page."""
    run = get_run_or_404(run_id)
    return _zip_response(request, jobs.newest_file(run), run)


def _zip_response(request: HtmxHttpRequest, path: Path | None, run: Run) -> HttpResponseBase:
    if path is None:
        # A page of its own, not Django's 404 (whose message never reaches the page): it says
        # what to do, in the reader's language.
        return render(request, "receipts/no_evidence.html", {"run": run}, status=HTTPStatus.NOT_FOUND)
    return FileResponse(path.open("rb"), as_attachment=True, filename=f"{jobs.stem_of(run)}.zip")


@require_POST
@requires("receipts.set_legal_hold")
def legal_hold(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Set or lift a legal hold, with a reason that is stored, audited and shown."""
    if settings.EVIDENCE_READ_ONLY:
        raise PermissionDenied("this deployment only browses")
    run = get_run_or_404(run_id)
    hold = choice(request, "hold", ("set", "lift"), form=True) == "set"
    form = LegalHoldForm(request.POST)
    if not form.is_valid():
        # The reason is the only field left to refuse (``choice`` refused a forged ``hold``).
        messages.error(request, " ".join(str(error) for error in form.errors["reason"]))
    else:
        actions.set_legal_hold(
            run=run, user=request.user, hold=hold, reason=form.cleaned_data["reason"], now=protocol.utc_now()
        )
        messages.success(request, _("Legal hold set: retention keeps this run.") if hold else _("Legal hold lifted."))
    return see_other(reverse("run", args=[run.run_id]))
