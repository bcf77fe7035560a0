""" "I'm on it": claim an inbox item, take it over, or let it go (evidence/review/claims.py).

A plain POST answers with a redirect back (303), or, when the answer needs a person (someone
else is on it: take it over?), with the claim's page. An htmx POST answers with the item's
claim box, swapped in place: 200 even when refused, since htmx swaps no 4xx, and the box says
why.
"""

from __future__ import annotations

from http import HTTPStatus

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import render
from django.utils.translation import gettext_lazy, gettext_noop
from django.views.decorators.http import require_POST

from evidence.lib.refused import Refused
from evidence.review import claims, inbox
from evidence.web.views.common import HtmxHttpRequest, choice, see_other
from evidence.web.views.triage import _safe_next
from receipts import protocol

DONE = {
    claims.CLAIM: gettext_lazy("You are on it: the others see it until you act, let it go, or it runs out."),
    claims.RELEASE: gettext_lazy("You let it go: the others no longer see you on it."),
}
# What a posted run_id and subject may be (the columns' lengths): longer is a 400.
LIMITS = {"run": 200, "subject": 450}


def _posted(request: HtmxHttpRequest, name: str) -> str:
    value = request.POST.get(name, "")
    if not value or len(value) > LIMITS[name]:
        raise Refused(gettext_noop("{name}: 1 to {limit} characters"), name=name, limit=LIMITS[name])
    return value


@require_POST
def claim_action(request: HtmxHttpRequest) -> HttpResponse:
    kind = choice(request, "kind", inbox.KINDS, form=True)
    action = choice(request, "action", claims.ACTIONS, form=True)
    item = claims.Item(kind, _posted(request, "run"), _posted(request, "subject"))
    if not claims.may_claim(request.user, kind):
        raise PermissionDenied("claiming this item needs what acting on it needs")
    back = _safe_next(request, request.POST.get("next"))
    now = protocol.utc_now()
    error, status, asking = "", HTTPStatus.OK, False
    try:
        if action == claims.CLAIM:
            claims.claim(item=item, user=request.user, take_over=request.POST.get("take_over") == "1", now=now)
        else:
            claims.release(item=item, user=request.user, now=now)
    except claims.ClaimError as refused:
        error, status, asking = refused.shown, refused.status, refused.held is not None
    context = {"claim_item": item, "claim": claims.claim_on_item(item, now), "claim_error": error,
               "claim_asking": asking, "back": back}  # fmt: skip
    if request.htmx:
        return render(request, "receipts/_claim.html", context)
    if error:
        return render(request, "receipts/claim.html", context, status=status)
    messages.success(request, DONE[action])
    return see_other(back)
