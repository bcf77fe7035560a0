"""What every page's header shows."""

from __future__ import annotations

from django.http import HttpRequest
from django.urls import Resolver404, resolve

from evidence.lib.roles import BROWSE
from evidence.review.inbox import inbox_total
from evidence.web.views.common import form_page
from receipts import __version__


def inbox(request: HttpRequest) -> dict[str, int]:
    """How many items wait in the inbox (only for a person who may browse)."""
    # A request refused before the authentication middleware ran (a disallowed Host) has no
    # user, and its 400 page is rendered with these processors all the same.
    user = getattr(request, "user", None)
    if user is None or not user.has_perm(BROWSE):
        return {}
    return {"inbox_count": inbox_total()}


def version(request: HttpRequest) -> dict[str, str]:
    """The version every page's footer names (one place: ``receipts.__version__``)."""
    return {"callproof_version": __version__}


def language_next(request: HttpRequest) -> dict[str, str]:
    """Where the language switcher goes back to: this page, but when this page answered a POST
    to a form's own URL (which takes only a POST: a 405 after the switch), the page that holds
    the form."""
    here = request.get_full_path()
    if request.method in ("GET", "HEAD"):
        return {"language_next": here}
    try:
        match = resolve(request.path_info)
    except Resolver404:
        return {"language_next": here}
    return {"language_next": form_page(match) or here}
