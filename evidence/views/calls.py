"""One call, and a run's recovery decisions."""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from evidence.views.common import download, download_format, get_call_or_404, get_run_or_404, paginate, query_without
from receipts import protocol, selectors
from receipts.models import Confirmation, Event

DECISION_COLUMNS = ("call_id", "status", "tool", "decision", "decision_reason")


def pretty(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@require_GET
def call(request: HttpRequest, run_id: str, call_id: str) -> HttpResponse:
    run = get_run_or_404(run_id)
    call = get_call_or_404(run, call_id)
    identity = selectors.call_identity(call=call, run=run) if call.receipt_present else None
    context = {
        "run": run,
        "call": call,
        "identity": identity,
        "identity_inputs": identity.inputs if identity else {},
        "args": pretty(call.args),
        "result": pretty(call.result) if call.result is not None else "",
        "error": pretty(call.error) if call.error is not None else "",
        "args_digest": protocol.input_sha256(call.args) if call.args is not None else "",
        "events": Event.objects.filter(run=run, call_id=call.call_id).order_by("seq")[:200],
        "confirmation": Confirmation.objects.filter(run=run, call_id=call.call_id).first(),
        "findings": run.findings.filter(call_id=call.call_id, closed_at__isnull=True).order_by("code"),
    }
    return render(request, "receipts/call.html", context)


@require_GET
def replay(request: HttpRequest, run_id: str) -> HttpResponse:
    run = get_run_or_404(run_id)
    decision = request.GET.get("decision", "")
    calls = selectors.calls_by_decision(run=run, decision=decision)
    fmt = download_format(request)
    if fmt:
        return download(fmt, f"{run.run_id}-replay", DECISION_COLUMNS, calls.values_list(*DECISION_COLUMNS).iterator())
    counts = selectors.decision_counts(run=run)
    context = {
        "run": run,
        "counts": counts,
        "total": sum(count for _, count in counts),
        "decision": decision,
        "page": paginate(request, calls, per_page=100),
        "query": query_without(request, "page", "format"),
    }
    return render(request, "receipts/replay.html", context)
