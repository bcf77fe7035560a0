"""Reads for the pages: plain functions with keyword-only arguments."""

from __future__ import annotations

from django.db.models import QuerySet

from receipts.models import Call


def prefix_upper_bound(prefix: str) -> str:
    """The smallest string greater than every string that starts with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def calls_with_prefix(*, prefix: str) -> QuerySet[Call]:
    """Calls whose call_id starts with ``prefix``, as a range scan on the call_id index.

    ``LIKE 'abc%'`` cannot use an index on SQLite (it is case-insensitive
    there); ``call_id >= 'abc' AND call_id < 'abd'`` can, on both databases.
    """
    if not prefix:
        return Call.objects.none()
    return Call.objects.filter(call_id__gte=prefix, call_id__lt=prefix_upper_bound(prefix))
