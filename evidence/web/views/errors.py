"""Error pages with the site's navigation: a 400 that says what is allowed, the one page a login
with no role sees, and a CSRF refusal that keeps what the person typed."""

from __future__ import annotations

from http import HTTPStatus
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.shortcuts import render
from django.urls import Resolver404, resolve, reverse
from django.utils.translation import gettext_lazy

from evidence.lib.roles import BROWSE, MissingPermission, role_givers, roles_with
from evidence.models import Call, Run
from evidence.web.forms import ConfirmForm
from evidence.web.views.calls import call_page, may_settle
from evidence.web.views.common import HtmxHttpRequest, Refused, form_page
from evidence.words import i18n


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    # Django's own 400 renders without the request, so without the navigation. A Refused
    # names what is allowed, in the reader's language, its values as code. Any other (Django's
    # DisallowedHost, a malformed upload) says how the server is configured ("add it to
    # ALLOWED_HOSTS"), which is for its log, not for whoever sent the request: the page says
    # only that the request could not be understood.
    message = exception.shown() if isinstance(exception, Refused) else None
    return render(request, "400.html", {"message": message}, status=HTTPStatus.BAD_REQUEST)


def no_role(request: HttpRequest) -> HttpResponse:
    return render(request, "no_role.html", {"admins": role_givers()}, status=HTTPStatus.FORBIDDEN)


def forbidden(request: HttpRequest, exception: Exception) -> HttpResponse:
    """A refusal that says which role would allow it, and who can give one (a refusal for another
    reason, a deployment that only browses, says only that it is not allowed)."""
    roles = roles_with(exception.permission) if isinstance(exception, MissingPermission) else []
    context = {"roles": [i18n.ROLE_WORDS.get(role, role) for role in roles], "admins": role_givers() if roles else []}
    return render(request, "403.html", context, status=HTTPStatus.FORBIDDEN)


# The fields a person typed, shown back by a refusal (the page that holds the form, to send it
# again from: FORM_PAGES).
TYPED_FIELDS = {"reason": gettext_lazy("Reason")}
CSRF_MESSAGE = gettext_lazy(
    "Nothing was done: this form came from a page that is out of date (you logged in again since it "
    "opened, or it was open a long time), so it could not be told apart from a forged one."
)


def csrf_failure(request: HtmxHttpRequest, reason: str = "") -> HttpResponse:
    """Django's CSRF refusal, in the site's clothes, keeping what the person typed.

    A settle form comes back as the call's page with the decision and reason filled in again
    and a fresh token; the call_id's first characters must be typed again, so a forged post is
    never one click from being sent. Another form shows what was typed, and links to its page.
    Only a post from our own pages (its Origin) gets what it carried back: a forged one gets the
    page without it.
    This runs before the login and role checks (the CSRF check comes first), so it makes them."""
    try:
        match = resolve(request.path_info)
    except Resolver404:
        match = None
    user = request.user if hasattr(request, "user") else None
    url_name = match.url_name if match else None
    # What was posted is shown back only when it came from one of our own pages: a forged post
    # from another site would otherwise put its text on our page, as "what you typed".
    ours = _posted_from_our_pages(request)
    if user is None or not user.is_authenticated:
        login = f"{reverse('login')}?{urlencode({'next': form_page(match) or reverse('runs')})}"
        return _csrf_page(request, login_url=login, show_typed=ours)
    if not user.has_perm(BROWSE):
        return no_role(request)
    if ours and url_name == "confirm" and match is not None and may_settle(user):
        refused = _settle_again(request, **match.kwargs)
        if refused is not None:
            return refused
    return _csrf_page(request, back=form_page(match), show_typed=ours)


def _posted_from_our_pages(request: HttpRequest) -> bool:
    """The browser's Origin header names this site (or an origin CSRF_TRUSTED_ORIGINS trusts),
    by the CSRF check's own rule. Every browser sends Origin with a form's POST; a post without
    one is not known to be ours."""
    if "HTTP_ORIGIN" not in request.META:
        return False
    check = CsrfViewMiddleware(lambda request: HttpResponse())
    return check._origin_verified(request)  # type: ignore[attr-defined]  # Django's rule; django-stubs omit private methods


def _settle_again(request: HtmxHttpRequest, run_id: str, call_id: str) -> HttpResponse | None:
    run = Run.objects.filter(run_id=run_id).first()
    call = Call.objects.filter(run=run, call_id=call_id).first() if run else None
    if run is None or call is None:
        return None
    retyped = {name: request.POST.get(name, "") for name in ("resolution", "reason", "receipt_sha256")}
    ticks = {name: bool(request.POST.get(name)) for name in ("confirm_queryable", "confirm_against_evidence")}
    form = ConfirmForm(initial={**retyped, **ticks})
    return call_page(request, run, call, form=form, error=str(CSRF_MESSAGE), status=HTTPStatus.FORBIDDEN)


def _csrf_page(
    request: HttpRequest, *, show_typed: bool, back: str | None = None, login_url: str | None = None
) -> HttpResponse:
    posted = request.POST if show_typed else {}
    typed = [(name, label, posted[name]) for name, label in TYPED_FIELDS.items() if posted.get(name, "").strip()]
    context = {"message": CSRF_MESSAGE, "typed": typed, "back": back, "login_url": login_url}
    return render(request, "403_csrf.html", context, status=HTTPStatus.FORBIDDEN)
