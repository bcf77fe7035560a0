"""What every page's header shows."""

from __future__ import annotations

from django.http import HttpRequest

from evidence.inbox import inbox_total
from evidence.roles import BROWSE
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
