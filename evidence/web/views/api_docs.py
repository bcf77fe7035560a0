"""The JSON API's interactive docs: django-ninja's Swagger UI, from our own static files."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET


@require_GET
def api_docs(request: HttpRequest) -> HttpResponse:
    """Swagger UI over ``/api/openapi.json`` (which answers this page's session like any script's
    token). Its files are the ones django-ninja ships (static/ninja/), so the page loads nothing
    from another origin and keeps the site's Content-Security-Policy."""
    # No deep links: Swagger UI puts each one, a link, inside the operation's button (axe's
    # nested-interactive), and a person reaches an operation by its place on the page.
    settings = {"url": reverse("api:openapi-json"), "layout": "BaseLayout", "deepLinking": False}
    return render(request, "api_docs.html", {"swagger_settings": settings})
