"""Every page needs a role: logging in is not enough to browse (evidence/lib/roles.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.cache import patch_cache_control
from django.utils.translation import gettext_noop

from evidence.lib.roles import BROWSE


class RoleRequiredMiddleware:
    """After Django's LoginRequiredMiddleware: a logged-in person without a role (no
    ``receipts.browse``) gets one page, a 403, wherever they go on the dashboard: it says they
    have no role yet and who may give them one (a page of links that all refuse would leave
    them nowhere to go). Views marked
    ``login_not_required`` (the login page, the health check) stay public, and the
    admin site keeps its own rule (the admin role, and each model's permissions: evidence/web/admin_site.py)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view_func: Callable, view_args: Any, view_kwargs: Any
    ) -> HttpResponse | None:
        if not getattr(view_func, "login_required", True) or not request.user.is_authenticated:
            return None  # public, or LoginRequiredMiddleware has sent the person to log in
        if request.resolver_match and request.resolver_match.app_name == "admin":
            return None
        if not request.user.has_perm(BROWSE):
            from evidence.web.views.errors import no_role  # views import the models: not at start-up

            return no_role(request)
        return None


class NoStoreMiddleware:
    """Nothing the dashboard answers is kept by a browser or a proxy cache: pages, downloads,
    the evidence zip and the API carry run data, and a shared machine's back button or a
    caching proxy must not show them to the next person. Static files (whitenoise, earlier in
    the chain) keep their own long-lived headers."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        patch_cache_control(response, no_store=True, private=True)
        return response


class RefuseNulMiddleware:
    """A U+0000 in the path or in a query parameter is a 400 before any view runs: no page
    or API answer needs one, and PostgreSQL refuses it in text with an error that would be a
    500. Posted forms are covered by Django's own fields, which refuse it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path or any(
            "\x00" in name or any("\x00" in value for value in values) for name, values in request.GET.lists()
        ):
            from evidence.web.views.common import Refused  # views import the models: not at start-up

            refused = Refused(
                gettext_noop("a {character} character is not allowed in the address"), character="U+0000 (NUL)"
            )
            if request.path.startswith("/api/"):
                return JsonResponse({"detail": str(refused)}, status=400)  # the API speaks English
            raise refused
        return self.get_response(request)
