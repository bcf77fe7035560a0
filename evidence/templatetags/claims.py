"""The "I'm on it" box's lookups (evidence/claims.py)."""

from __future__ import annotations

from typing import Any

from django import template

from evidence import claims
from receipts import protocol

register = template.Library()


@register.simple_tag
def live_claims(items: Any) -> dict[str, Any]:
    """The live claims on a table's items: one query, whichever page holds the table."""
    return claims.live_claims(items, protocol.utc_now())


@register.filter
def claim_of(live: dict[str, Any] | None, item: Any) -> Any:
    """The live claim on an inbox item, from the page's ``claims.live_claims``."""
    return (live or {}).get(claims.key_of(item.kind, item.run_id, item.subject))


@register.filter
def may_claim(user: Any, kind: str) -> bool:
    return claims.may_claim(user, kind)
