"""One call, and a run's recovery decisions."""

from __future__ import annotations

import json

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from evidence.views.common import (
    HtmxHttpRequest,
    download,
    download_format,
    get_call_or_404,
    get_run_or_404,
    paginate,
    query_without,
)
from receipts import downloads, selectors


def pretty(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@require_GET
def call(request: HtmxHttpRequest, run_id: str, call_id: str) -> HttpResponse:
    run = get_run_or_404(run_id)
    call = get_call_or_404(run, call_id)
    detail = selectors.call_detail(run=run, call=call)
    context = {
        "run": run,
        "call": call,
        "identity": detail.identity,
        "identity_inputs": detail.identity.inputs if detail.identity else {},
        "args": pretty(call.args),
        "result": pretty(call.result) if call.result is not None else "",
        "error": pretty(call.error) if call.error is not None else "",
        "events": detail.events,
        "confirmation": detail.confirmation,
        "findings": detail.findings,
    }
    return render(request, "receipts/call.html", context)


@require_GET
def replay(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = get_run_or_404(run_id)
    decision = request.GET.get("decision", "")
    fmt = download_format(request)
    if fmt:
        return download(fmt, f"{run.run_id}-replay", *downloads.decision_rows(run=run, decision=decision))
    counts = selectors.decision_counts(run=run)
    context = {
        "run": run,
        "counts": counts,
        "total": sum(count for _, count in counts),
        "decision": decision,
        "page": paginate(request, selectors.calls_by_decision(run=run, decision=decision), per_page=100),
        "query": query_without(request, "page", "format"),
    }
    return render(request, "receipts/replay.html", context)
