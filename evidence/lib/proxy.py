"""The client's address, by one rule for the login throttle, the audit of decisions and
``/metrics``.

Without a proxy (``EVIDENCE_PROXY_COUNT=0``) it is the connection's address. Behind N
proxies it is the address the outermost of them saw: each proxy appends the address it got
the request from to ``X-Forwarded-For`` (nginx: ``$proxy_add_x_forwarded_for``), so the
client's is the N-th from the right. Whatever a client writes into the header itself stays
to the left of it and is never read: a client cannot choose its address by sending one.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest


def behind_proxy() -> bool:
    return settings.PROXY_COUNT > 0


def client_address(request: HttpRequest) -> str | None:
    remote = request.META.get("REMOTE_ADDR") or None
    if not behind_proxy():
        return remote
    hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
    if len(hops) < settings.PROXY_COUNT:
        # The proxies did not say (a configuration without the header): the one fact is the
        # proxy's own address. deploy/nginx.conf sets the header (docs/operations.md).
        return remote
    try:
        return str(ipaddress.ip_address(hops[-settings.PROXY_COUNT]))
    except ValueError:
        return remote
