"""The shipper's endpoints (``/ship/v1/``): JSON in, JSON out, a host key instead of a login.
Parse, call ``evidence.ingest.shipping``, answer; every refusal is a status and a sentence."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from evidence.ingest import mirror, shipping
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
                    # A request with no body reads the host's clock: an upload's time is not its clock's.
                    clock=request.headers.get("X-Callproof-Time", "") if method == "GET" else "",
                )  # fmt: skip
                return JsonResponse(handler(request, host), safe=False)
            except shipping.ShipError as refused:
                answer = JsonResponse({"error": refused.message, **refused.extra}, status=refused.status)
                if "retry_after" in refused.extra:
                    answer["Retry-After"] = str(max(1, math.ceil(refused.extra["retry_after"])))
                return answer

        view.__name__ = view.__qualname__ = handler.__name__
        return view

    return wrap


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# What a shipper sends is a few levels deep; JSON nested deeper is no shipper's, and Python's
# parser would run out of stack on it (a RecursionError, a 500) long before it ran out of bytes.
MAX_DEPTH = 8


def _json(request: HttpRequest) -> Any:
    try:
        document = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        raise shipping.ShipError(400, "the body is not JSON") from None
    except RecursionError:
        raise shipping.ShipError(400, f"the body nests deeper than {MAX_DEPTH} levels") from None
    if _too_deep_or_nul(document, MAX_DEPTH):
        # RefuseNulMiddleware reads only the address: a body's "\u0000" would reach PostgreSQL's text.
        raise shipping.ShipError(
            400, f"the body nests deeper than {MAX_DEPTH} levels, or holds a U+0000 (NUL) or a lone surrogate"
        )
    return document


def _too_deep_or_nul(value: Any, depth: int) -> bool:
    if isinstance(value, str):
        # A lone surrogate ("\ud800" in JSON) is no text a database can store.
        return "\x00" in value or (not value.isascii() and not _encodes(value))
    if isinstance(value, dict | list) and depth <= 0:
        return True
    if isinstance(value, dict):
        return any(_too_deep_or_nul(key, depth) or _too_deep_or_nul(item, depth - 1) for key, item in value.items())
    if isinstance(value, list):
        return any(_too_deep_or_nul(item, depth - 1) for item in value)
    return False


@_shipper_view("POST")
def push(request: HttpRequest, host: Host) -> dict[str, Any]:
    return mirror.push(host, _json(request))


@_shipper_view("POST")
def report(request: HttpRequest, host: Host) -> dict[str, Any]:
    return mirror.report(host, _json(request))


@_shipper_view("POST")
def removal(request: HttpRequest, host: Host) -> dict[str, Any]:
    return shipping.confirm_removal(host, _json(request))


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
