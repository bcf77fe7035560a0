"""The "I'm on it" box's lookups (evidence/review/claims.py)."""

from __future__ import annotations

import hashlib
from typing import Any

from django import template

from evidence.review import claims
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
def claim_button_id(item: Any) -> str:
    """One id for an item's button, whichever it is (I'm on it, let it go, take over): htmx gives
    the keyboard's focus back to the element of the same id after it swaps the box."""
    key = claims.key_of(item.kind, item.run_id, item.subject)
    return "claim-" + hashlib.sha256(key.encode()).hexdigest()[:16]


@register.filter
def may_claim(user: Any, kind: str) -> bool:
    return claims.may_claim(user, kind)
