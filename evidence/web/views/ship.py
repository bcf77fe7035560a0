"""The shipper's endpoints (``/ship/v1/``): JSON in, JSON out, a host key instead of a login.
Parse, call ``evidence.ingest.shipping``, answer; every refusal is a status and a sentence."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from evidence.ingest import shipping
from evidence.models import Host


def _shipper_view(method: str) -> Callable:
    """Authenticate the host by its key, check it in, and turn a ``ShipError`` into its answer."""

    def wrap(handler: Callable[[HttpRequest, Host], Any]) -> Callable:
        @csrf_exempt  # no cookie, no session: the key in the header is the credential
        @login_not_required
        @require_http_methods([method])
        def view(request: HttpRequest) -> JsonResponse:
            try:
                host = shipping.authenticate(request.headers.get("Authorization", ""))
                host = shipping.check_in(
                    host, instance=request.headers.get("X-Callproof-Shipper", ""),
                    root=request.headers.get("X-Callproof-Root", ""),
                    version=request.headers.get("X-Callproof-Version", ""),
                )  # fmt: skip
                return JsonResponse(handler(request, host), safe=False)
            except shipping.ShipError as refused:
                return JsonResponse({"error": refused.message, **refused.extra}, status=refused.status)

        view.__name__ = view.__qualname__ = handler.__name__
        return view

    return wrap


def _json(request: HttpRequest) -> Any:
    try:
        document = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        raise shipping.ShipError(400, "the body is not JSON") from None
    if _holds_nul(document):
        # RefuseNulMiddleware reads only the address: a body's "\u0000" would reach PostgreSQL's text.
        raise shipping.ShipError(400, "a U+0000 (NUL) character is not allowed in the body")
    return document


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(key) or _holds_nul(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_holds_nul(item) for item in value)
    return False


@_shipper_view("POST")
def push(request: HttpRequest, host: Host) -> dict[str, Any]:
    return shipping.push(host, _json(request))


@_shipper_view("GET")
def instructions(request: HttpRequest, host: Host) -> dict[str, Any]:
    return {"host": host.name, "instructions": shipping.instructions(host)}


@_shipper_view("POST")
def acks(request: HttpRequest, host: Host) -> dict[str, Any]:
    return shipping.acknowledge(host, _json(request))


@_shipper_view("POST")
def stopped(request: HttpRequest, host: Host) -> dict[str, Any]:
    shipping.stopped(host, instance=request.headers.get("X-Callproof-Shipper", ""))
    return {"stopped": host.name}
