"""One call, and a run's recovery decisions."""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from evidence.views.common import download, download_format, get_call_or_404, get_run_or_404
from receipts import protocol, selectors
from receipts.models import Call, Confirmation, Event

DECISION_COLUMNS = ("call_id", "status", "tool", "decision", "decision_reason")


def pretty(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@require_GET
def call(request: HttpRequest, run_id: str, call_id: str) -> HttpResponse:
    run = get_run_or_404(run_id)
    call = get_call_or_404(run, call_id)
    identity_inputs = {
        "identity": call.identity or protocol.IDENTITY_V1,
        "contract_sha256": call.contract_sha256 or run.contract_sha256,
        "attempt": call.attempt,
        "tool": call.tool,
        "tool_version": call.tool_version or None,
    }
    context = {
        "run": run,
        "call": call,
        "identity_inputs": identity_inputs,
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
    fmt = download_format(request)
    if fmt:
        rows = Call.objects.filter(run=run).order_by("decision", "call_id").values_list(*DECISION_COLUMNS)
        return download(fmt, f"{run.run_id}-replay", DECISION_COLUMNS, rows.iterator())
    groups = selectors.decisions_of(run=run)
    return render(
        request,
        "receipts/replay.html",
        {"run": run, "groups": [(d, calls) for d, calls in groups.items()], "total": sum(map(len, groups.values()))},
    )
