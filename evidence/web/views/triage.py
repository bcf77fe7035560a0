"""A finding's triage: acknowledge or snooze it with a reason, or undo either (evidence/review/triage.py)."""

from __future__ import annotations

from http import HTTPStatus

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET, require_POST

from evidence.lib.roles import TRIAGE, requires
from evidence.models import Finding
from evidence.review import claims, selectors, triage
from evidence.web.forms import TriageForm
from evidence.web.views.common import HtmxHttpRequest, see_other
from receipts import protocol

DONE = {
    triage.ACKNOWLEDGE: gettext_lazy("Acknowledged: it leaves the inbox until it closes, or you undo it."),
    triage.UNACKNOWLEDGE: gettext_lazy("No longer acknowledged: it is back in the inbox."),
    triage.SNOOZE: gettext_lazy("Snoozed: it leaves the inbox until its snooze ends."),
    triage.UNSNOOZE: gettext_lazy("No longer snoozed: it is back in the inbox."),
}
# What the history says of each act, beside the audit's own word for it (shown as code).


def may_triage(user) -> bool:
    """Who sees the triage forms: the permission, on a deployment that writes."""
    return user.has_perm(TRIAGE) and not settings.EVIDENCE_READ_ONLY


def _finding_or_404(finding_id: int) -> Finding:
    # A runs root's findings have no run whose audit would hold the act: they are not triaged.
    return get_object_or_404(Finding.objects.select_related("run"), pk=finding_id, run__isnull=False)


@require_GET
def triage_page(request: HtmxHttpRequest, finding_id: int) -> HttpResponse:
    return _page(request, _finding_or_404(finding_id), None)


def _page(
    request: HtmxHttpRequest, finding: Finding, form: TriageForm | None, *, error: str = "", status: int = HTTPStatus.OK
) -> HttpResponse:
    triage.as_shown([finding], protocol.utc_now())
    back = _safe_next(request, request.POST.get("next") if request.method == "POST" else request.GET.get("next"))
    context = {
        "finding": finding,
        "form": form or TriageForm(initial={"next": back}),
        "may_triage": may_triage(request.user) and finding.closed_at is None,
        "history": selectors.triage_history(finding=finding),
        "triage_error": error,
        "back": back,
        **claims.box(claims.item_of_finding(finding), protocol.utc_now()),
    }
    return render(request, "receipts/triage.html", context, status=status)


def _safe_next(request: HtmxHttpRequest, value: str | None) -> str:
    """Where to go back to: a page of this site, or the inbox."""
    if value and url_has_allowed_host_and_scheme(value, allowed_hosts={request.get_host()},
                                                 require_https=request.is_secure()):  # fmt: skip
        return value
    return reverse("inbox")


@require_POST
@requires(TRIAGE)
def triage_action(request: HtmxHttpRequest, finding_id: int) -> HttpResponse:
    if settings.EVIDENCE_READ_ONLY:
        raise PermissionDenied("this deployment only browses")
    finding = _finding_or_404(finding_id)
    assert request.user.is_authenticated  # permission_required above lets no anonymous visitor in
    form = TriageForm(request.POST)
    if not form.is_valid():
        return _page(request, finding, form, status=HTTPStatus.BAD_REQUEST)
    now = protocol.utc_now()
    until, on_change = form.snooze_end(now)
    action = form.cleaned_data["action"]
    try:
        triage.act(finding=finding, user=request.user, action=action, reason=form.cleaned_data["reason"],
                   until=until, on_change=on_change, now=now)  # fmt: skip
    except triage.TriageError as refused:
        if refused.field in form.fields:
            form.add_error(refused.field, refused.shown)
            return _page(request, finding, form, status=refused.status)
        return _page(request, finding, form, error=refused.shown, status=refused.status)
    messages.success(request, DONE[action])
    return see_other(_safe_next(request, form.cleaned_data["next"]))
