"""Who is told of the inbox's items: the notification rules and the delivery log (the admin role)."""

from __future__ import annotations

from http import HTTPStatus

from django.contrib.auth.decorators import permission_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from evidence.lib.pagination import Segment, cursor_page
from evidence.models import NotificationRule
from evidence.review import alerts
from evidence.web.forms import NotificationRuleForm
from evidence.web.views.common import HtmxHttpRequest, choice, query_without, see_other

MANAGE = "receipts.manage_notifications"


def _page(request: HtmxHttpRequest, form: NotificationRuleForm, status: int = HTTPStatus.OK) -> HttpResponse:
    context = {
        "rules": NotificationRule.objects.order_by("name", "pk"),
        "form": form,
        "log": cursor_page(
            request, [Segment(alerts.delivery_log(), ("-at", "-id"))], query=query_without(request, "page")
        ),
        "public_url": alerts.link_of("/"),
    }
    return render(request, "receipts/notifications.html", context, status=status)


@require_GET
@permission_required(MANAGE, raise_exception=True)
def notifications_page(request: HtmxHttpRequest) -> HttpResponse:
    return _page(request, NotificationRuleForm())


@require_POST
@permission_required(MANAGE, raise_exception=True)
def rule_add(request: HtmxHttpRequest) -> HttpResponse:
    form = NotificationRuleForm(request.POST)
    if not form.is_valid():
        return _page(request, form, HTTPStatus.BAD_REQUEST)
    alerts.rule_add(user=request.user, fields=form.cleaned_data)
    return see_other(reverse("notifications"))


@require_POST
@permission_required(MANAGE, raise_exception=True)
def rule_action(request: HtmxHttpRequest, rule_id: int) -> HttpResponse:
    rule = get_object_or_404(NotificationRule, pk=rule_id)
    alerts.rule_act(rule=rule, action=choice(request, "action", alerts.RULE_ACTIONS, form=True), user=request.user)
    return see_other(reverse("notifications"))
