"""One call, and a run's recovery decisions."""

from __future__ import annotations

import json
from http import HTTPStatus

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse, HttpResponseBase
from django.shortcuts import render
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from evidence.ingest import withdrawal
from evidence.lib import hosts
from evidence.lib.pagination import cursor_page, first_rows
from evidence.lib.proxy import client_address
from evidence.lib.roles import requires
from evidence.models import Call, Run
from evidence.review import claims, listings, selectors, settle
from evidence.web import settle_words
from evidence.web.forms import ConfirmForm
from evidence.web.views.common import (
    HtmxHttpRequest,
    choice,
    download,
    download_format,
    get_call_or_404,
    get_run_or_404,
    query_without,
    see_other,
)
from evidence.words import i18n
from receipts import protocol

# The recovery page lists a run's pending problems first; the inbox has them all.
PENDING_SHOWN = 50


def pretty(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@require_GET
def call(request: HtmxHttpRequest, run_id: str, call_id: str) -> HttpResponse:
    run = get_run_or_404(run_id)
    return call_page(request, run, get_call_or_404(run, call_id))


def call_page(
    request: HtmxHttpRequest,
    run: Run,
    call: Call,
    *,
    form: ConfirmForm | None = None,
    error: str = "",
    status: int = HTTPStatus.OK,
) -> HttpResponse:
    detail = selectors.call_detail(run=run, call=call)
    in_doubt = settle.may_be_settled(call)
    # What the target shows stays on the page once a person decided: the decision is held against it.
    decided = detail.decision.resolution if detail.decision is not None and not detail.decision.undeliverable else ""
    if not decided and detail.confirmation is not None and detail.confirmation.valid:
        decided = detail.confirmation.resolution
    target = selectors.doubt_panel(run=run, call=call) if in_doubt or (decided and call.receipt_present) else None
    # One decision a call: one its host refused stays on record, and the writer settles it there.
    can_settle = in_doubt and may_settle(request.user) and detail.decision is None
    if can_settle and form is None:
        form = ConfirmForm(initial={"receipt_sha256": call.file_sha256})
    context = {
        "run": run,
        "call": call,
        "identity": detail.identity,
        "identity_inputs": detail.identity.inputs if detail.identity else {},
        "args": pretty(call.args),
        "result": pretty(call.result) if call.result is not None else "",
        "error": pretty(call.error) if call.error is not None else "",
        # A rejected call's reason, as its tool said it, first on the page (the JSON stays below).
        "error_message": call.error.get("message")
        if isinstance(call.error, dict) and isinstance(call.error.get("message"), str)
        else "",
        "events": detail.events,
        "confirmation": detail.confirmation,
        "findings": detail.findings,
        "decision": detail.decision,
        "decided": decided,
        "in_doubt": in_doubt,
        "doubt": target if in_doubt else None,
        "target": target if not in_doubt else None,
        "target_contradicts": target is not None
        and settle.against_evidence(decided, target.evidence.verdict if target.evidence else None),
        # A receipt altered since it was written gets a panel of its own, settled or not.
        "altered": selectors.altered_fields(call=call) if call.verification == protocol.MISMATCH else None,
        "settled_by": detail.settled_by,
        "settled_on_host": detail.settled_on_host,
        # Settled by a file no decision made here matches: where, by what name, its audit entry and inbox item.
        "host_decision": selectors.host_decision(run=run, detail=detail),
        # Its receipt fails its check: its events say what the receipt said, which proves nothing.
        "unproven": call.receipt_present and call.verification in protocol.SHOWN_FOR_VERDICT,
        "form": form if can_settle else None,
        # A decision not yet written into the run directory can be taken back by whoever may settle.
        "can_withdraw": detail.decision is not None and detail.decision.pending and may_settle(request.user),
        "second_tick": settle.needs_second_tick(call),
        "settle_error": error,
        "read_only": settings.EVIDENCE_READ_ONLY,
        "host": run.host,
        "host_silent": run.host is not None and hosts.is_silent(run.host),
        **claims.box(claims.item_of_call(call), protocol.utc_now()),
        "back": request.get_full_path()
        if request.method == "GET"
        else reverse("call", args=[run.run_id, call.call_id]),
    }
    return render(request, "receipts/call.html", context, status=status)


def may_settle(user) -> bool:
    """Who sees the form: the permission, on a deployment that writes."""
    return user.has_perm("receipts.confirm_call") and not settings.EVIDENCE_READ_ONLY


def _call_to_decide(request: HtmxHttpRequest, run_id: str, call_id: str) -> tuple[Run, Call, User]:
    """The run and the call a decision is posted for, and who posts it, on a deployment that writes."""
    if settings.EVIDENCE_READ_ONLY:
        raise PermissionDenied("this deployment only browses")
    run = get_run_or_404(run_id)
    assert isinstance(request.user, User)  # permission_required above lets no anonymous visitor in
    return run, get_call_or_404(run, call_id), request.user


@require_POST
@requires("receipts.confirm_call")
def confirm(request: HtmxHttpRequest, run_id: str, call_id: str) -> HttpResponse:
    run, call, user = _call_to_decide(request, run_id, call_id)
    form = ConfirmForm(request.POST)
    if not form.is_valid():
        # Every field at once: what the form refused, and the settle's rules on what it took.
        form.add_problems(settle.field_problems(call, **form.settle_fields()))
        return call_page(request, run, call, form=form, status=HTTPStatus.BAD_REQUEST)
    try:
        settlement = settle.settle_call(
            run=run,
            call=call,
            user=user,
            receipt_sha256=form.cleaned_data["receipt_sha256"],
            client_address=client_address(request),
            **form.settle_fields(),
        )
    except settle.SettleError as refused:
        if refused.problems:  # each beside its field (aria-invalid, described by its message), and summed up
            form.add_problems(refused.problems)
            return call_page(request, run, call, form=form, status=refused.status)
        return call_page(request, run, call, form=form, error=settle_words.refusal(refused), status=refused.status)
    decision = settlement.decision
    resolution = i18n.word(decision.resolution)
    if settlement.created and decision.pending:
        said = _("Settled as {resolution}. Host {host} writes it into the run directory at its next pass; the "
                 "runtime follows it when it resumes.")  # fmt: skip
        host = format_html("<code>{}</code>", run.host)
        messages.success(request, format_html(said, resolution=resolution, host=host))
    elif settlement.created:
        said = _("Settled as {resolution}. The runtime follows it when it resumes.")
        messages.success(request, format_html(said, resolution=resolution))
    else:
        said = _("This decision was already recorded ({resolution}, by {actor}).")
        actor = format_html('<span translate="no">{}</span>', decision.actor)
        messages.info(request, format_html(said, resolution=resolution, actor=actor))
    return see_other(reverse("call", args=[run.run_id, call.call_id]))


@require_POST
@requires("receipts.confirm_call")
def withdraw(request: HtmxHttpRequest, run_id: str, call_id: str) -> HttpResponse:
    """Take back a decision its host has not written yet (anyone who may settle: the person who made it too)."""
    run, call, user = _call_to_decide(request, run_id, call_id)
    try:
        decision = withdrawal.withdraw(run=run, call=call, user=user)
    except settle.SettleError as refused:
        return call_page(request, run, call, error=settle_words.refusal(refused), status=refused.status)
    if decision.resolution == "committed":
        said = _("Withdrawn: the decision that this call happened was never written into the run. It is in doubt "
                 "again; the audit keeps the decision and who withdrew it.")  # fmt: skip
    else:
        said = _("Withdrawn: the decision that this call did not happen was never written into the run. It is in "
                 "doubt again; the audit keeps the decision and who withdrew it.")  # fmt: skip
    messages.success(request, said)
    return see_other(reverse("call", args=[run.run_id, call.call_id]))


@require_GET
def replay(request: HtmxHttpRequest, run_id: str) -> HttpResponseBase:
    run = get_run_or_404(run_id)
    decision = choice(request, "decision", protocol.DECISIONS)
    listing = listings.decisions(run=run, decision=decision)
    fmt = download_format(request)
    if fmt:
        return download(fmt, listing)
    counts = selectors.decision_counts(run=run)
    context = {
        "run": run,
        "pending": first_rows(listings.inbox(run_id=run.run_id).segments, PENDING_SHOWN),
        "counts": counts,
        "total": sum(count for _, count in counts),
        "decision": decision,
        "page": cursor_page(
            request, listing.segments, per_page=100, total=listing.total, query=query_without(request, "page", "format")
        ),
        "query": query_without(request, "page", "format"),
    }
    return render(request, "receipts/replay.html", context)
