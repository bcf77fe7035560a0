"""What every page's header shows."""

from __future__ import annotations

from django.http import HttpRequest

from receipts.inbox import inbox_total


def inbox(request: HttpRequest) -> dict[str, int]:
    """How many items wait in the inbox (only for a person who is logged in)."""
    if not request.user.is_authenticated:
        return {}
    return {"inbox_count": inbox_total()}
