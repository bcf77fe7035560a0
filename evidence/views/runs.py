"""The runs list, one run, the search box."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from evidence.views.common import download, download_format, get_run_or_404, paginate, query_without
from receipts import selectors
from receipts.models import Call, Submission

RUN_COLUMNS = ("run_id", "state", "attempts", "last_event_at", "events", "calls", "ambiguous", "open_findings")
EVENT_COLUMNS = ("seq", "ts", "type", "call_id", "client_submission_id", "disposition", "payload")
CALL_COLUMNS = ("call_id", "status", "tool", "tool_version", "attempt", "verification", "decision", "updated_at")
SUBMISSION_COLUMNS = ("client_submission_id", "state", "task_id", "request_digest", "task_present", "updated_at")


@require_GET
def runs(request: HttpRequest) -> HttpResponse:
    state = request.GET.get("state", "")
    attention = request.GET.get("attention") == "1"
    runs = selectors.runs_list(state=state, attention=attention)
    fmt = download_format(request)
    if fmt:

        def rows():
            for chunk_start in range(0, runs.count(), 500):
                chunk = list(runs[chunk_start : chunk_start + 500])
                summaries = selectors.run_summaries(runs=chunk)
                for run in chunk:
                    s = summaries[run.pk]
                    yield (run.run_id, run.state, run.attempts, run.last_event_at, run.event_count, s.calls,
                           s.ambiguous, s.open_findings)  # fmt: skip

        return download(fmt, "runs", RUN_COLUMNS, rows)
    page = paginate(request, runs)
    summaries = selectors.run_summaries(runs=page.object_list)
    times = [t for run in page.object_list for t in (run.first_event_at, run.last_event_at) if t]
    context = {
        "page": page,
        "rows": [(run, summaries[run.pk]) for run in page.object_list],
        "states": selectors.run_states(),
        "state": state,
        "attention": attention,
        "span": (min(times), max(times)) if times else None,
        "totals": selectors.run_totals(),
        "query": query_without(request, "page", "format"),
    }
    template = "receipts/runs.html#runs-table" if request.htmx else "receipts/runs.html"
    return render(request, template, context)


@require_GET
def search(request: HttpRequest) -> HttpResponse:
    query = request.GET.get("q", "")
    result = selectors.search(query=query)
    if result.url is not None:
        return redirect(result.url)
    return render(request, "receipts/search.html", {"q": query, "result": result})


@require_GET
def run(request: HttpRequest, run_id: str) -> HttpResponse:
    run = get_run_or_404(run_id)
    event_type = request.GET.get("type", "")
    events = selectors.run_events(run=run, event_type=event_type)
    fmt = download_format(request)
    if fmt:
        return _run_download(fmt, run, request.GET.get("list", "events"), events)
    timeline = paginate(request, events)
    live = not run.is_finished and timeline.number == 1
    timeline_context = {
        "run": run,
        "timeline": timeline,
        "live": live,
        "event_type": event_type,
        "query": query_without(request, "page", "format"),
    }
    if request.htmx:
        return render(request, "receipts/run.html#timeline", timeline_context)
    calls = paginate(request, Call.objects.filter(run=run).order_by("call_id"), param="calls_page")
    submission_filter = request.GET.get("submission", "")
    submissions = Submission.objects.filter(run=run).order_by("client_submission_id")
    if submission_filter:
        submissions = submissions.filter(client_submission_id=submission_filter)
    submissions_page = paginate(request, submissions, param="submissions_page")
    history = selectors.disposition_history(
        run=run, submission_ids=[s.client_submission_id for s in submissions_page.object_list]
    )
    reuse = selectors.reuse_counts(run=run, call_ids=[c.call_id for c in calls.object_list])
    summary = selectors.run_summaries(runs=[run])[run.pk]
    context = timeline_context | {
        "summary": summary,
        "histogram": selectors.events_histogram(run=run),
        "event_types": selectors.event_types(run=run),
        "calls": calls,
        "call_rows": [(call, reuse.get(call.call_id, 0)) for call in calls.object_list],
        "submissions": submissions_page,
        "submission_filter": submission_filter,
        "submission_rows": [(s, history.get(s.client_submission_id, [])) for s in submissions_page.object_list],
        "legacy": selectors.legacy_submissions(run=run)[:50],
        "findings": run.findings.filter(closed_at__isnull=True).order_by("code", "subject")[:200],
    }
    return render(request, "receipts/run.html", context)


def _run_download(fmt: str, run, which: str, events) -> HttpResponse:
    name = f"{run.run_id}-{which}"
    if which == "calls":
        rows = Call.objects.filter(run=run).order_by("call_id").values_list(*CALL_COLUMNS)
        return download(fmt, name, CALL_COLUMNS, rows.iterator())
    if which == "submissions":
        rows = Submission.objects.filter(run=run).order_by("client_submission_id").values_list(*SUBMISSION_COLUMNS)
        return download(fmt, name, SUBMISSION_COLUMNS, rows.iterator())
    rows = events.order_by("seq").values_list(*EVENT_COLUMNS)
    return download(fmt, name, EVENT_COLUMNS, rows.iterator(chunk_size=5000))
