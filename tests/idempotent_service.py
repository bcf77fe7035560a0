"""A small payments service that keeps idempotency keys the way Stripe documents them, for the HTTP adapter's tests.

``POST /v1/charges`` (JSON body with a positive whole ``amount``) creates a
charge. With an ``Idempotency-Key`` header: the first request's response is
saved; the same key with the same body is answered from it, with
``Idempotent-Replayed: true``, and creates nothing; the same key with another
body is a 400 ``idempotency_error``; the same key while its first request is
still running is a 409; a key is kept for 24 hours. Every answer carries a
``Date`` from the service's own clock (``clock``, which a test moves; ``dated``
off: no ``Date`` at all). A body that fails
validation saves nothing (the key can be used again). Lookups:
``GET /v1/charges/<id>`` and ``GET /v1/charges?idempotency_key=<key>`` (a key it keeps, so
for 24 hours: then a 404, as for a key never seen). ``GET /test/count?idempotency_key=<key>``
counts the charges made under a key, for the conformance kit (``count_charges``).

It can be told (``script``) to drop the connection after doing the effect
(a lost response) or to answer a status (500, 429) before doing anything,
and to hold a request's effect until released (``hold``). Threaded, on 127.0.0.1, a free
port. ``python -m tests.idempotent_service`` serves until interrupted and prints its URL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.utils
import hashlib
import itertools
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KEY_LIFETIME = 24 * 3600


@dataclasses.dataclass
class Saved:
    fingerprint: str
    created: float
    status: int | None = None  # None: the first request is still running
    body: bytes = b""


class Service:
    """The service's state and the switches a test turns."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock  # the service's own: its keys' ages and every answer's Date
        self.dated = True  # False: answers carry no Date header
        self.lock = threading.Lock()
        self.keys: dict[str, Saved] = {}
        self.charges: list[dict[str, Any]] = []  # the effects, one per charge made
        self.requests: list[tuple[str, str | None]] = []  # (method path, key) of every request received
        self.authorizations: list[str | None] = []  # each POST's Authorization header
        # What the next POSTs meet, in order: "drop" (the effect is made, the connection dropped before
        # the answer) or a status answered before anything is done (500, 429); then the endpoint as usual.
        self.script: list[str | int] = []
        self.hold: threading.Event | None = None  # the effect waits for it
        self.conflicts = threading.Event()  # set at the first 409
        self._ids = itertools.count(1)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        port = self.server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def __enter__(self) -> Service:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def charge(self, body: dict[str, Any], key: str | None) -> dict[str, Any]:
        if self.hold is not None:
            self.hold.wait()
        with self.lock:
            charge = {"id": f"ch_{next(self._ids)}", "amount": body["amount"], "idempotency_key": key,
                      "description": body.get("description")}  # fmt: skip
            self.charges.append(charge)
            return charge


def _handler(service: Service) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def date_time_string(self, timestamp: float | None = None) -> str:
            # The Date header: the service's own clock, the one that dates its keys.
            return email.utils.formatdate(service.clock() if timestamp is None else timestamp, usegmt=True)

        def send_header(self, keyword: str, value: str) -> None:
            if keyword.lower() != "date" or service.dated:
                super().send_header(keyword, value)

        def answer(self, status: int, document: Any, *, replayed: bool = False, raw: bytes | None = None) -> None:
            data = raw if raw is not None else json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if replayed:
                self.send_header("Idempotent-Replayed", "true")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            parts = urllib.parse.urlsplit(self.path)
            service.requests.append((f"GET {parts.path}", None))
            if parts.path == "/moved":  # a redirect elsewhere: a client must not follow it
                self.send_response(302)
                self.send_header("Location", "http://127.0.0.2:9/v1/charges")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            key = urllib.parse.parse_qs(parts.query).get("idempotency_key", [None])[0]
            with service.lock:
                if parts.path == "/test/count" and key:
                    # Every charge made under the key, forgotten or not: the conformance kit's counter.
                    made = sum(charge["idempotency_key"] == key for charge in service.charges)
                    self.answer(200, {"charges": made})
                    return
                if parts.path == "/v1/charges" and key:
                    # A key is found only while the service keeps it: past its lifetime it is forgotten.
                    saved = service.keys.get(key)
                    kept = saved is not None and service.clock() - saved.created <= KEY_LIFETIME
                    found = [charge for charge in service.charges if kept and charge["idempotency_key"] == key]
                elif parts.path.startswith("/v1/charges/"):
                    wanted = urllib.parse.unquote(parts.path.removeprefix("/v1/charges/"))
                    found = [charge for charge in service.charges if charge["id"] == wanted]
                else:
                    found = []
            if found:
                self.answer(200, found[0])
            else:
                self.answer(404, {"error": {"type": "invalid_request_error", "message": "No such charge"}})

        def do_POST(self) -> None:
            key = self.headers.get("Idempotency-Key")
            service.requests.append((f"POST {self.path}", key))
            service.authorizations.append(self.headers.get("Authorization"))
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            step = service.script.pop(0) if service.script else None
            if isinstance(step, int):
                self.answer(step, {"error": {"type": "api_error", "message": f"scripted {step}"}})
                return
            try:
                body = json.loads(data)
                valid = self.path == "/v1/charges" and isinstance(body, dict) and type(body.get("amount")) is int
            except ValueError:
                valid = False
            if not valid or body["amount"] < 1:
                # Refused before the endpoint ran: nothing saved for the key (Stripe does the same).
                self.answer(400, {"error": {"type": "invalid_request_error", "message": "amount must be positive"}})
                return
            fingerprint = hashlib.sha256(b"POST " + self.path.encode() + b"\n" + data).hexdigest()
            if key:
                with service.lock:
                    saved = service.keys.get(key)
                    if saved is not None and service.clock() - saved.created > KEY_LIFETIME:
                        saved = None  # expired: the key is new again
                    if saved is None:
                        service.keys[key] = Saved(fingerprint, service.clock())
                if saved is not None:
                    self.answer_saved(saved, fingerprint)
                    return
            charge = service.charge(body, key)
            response = json.dumps(charge).encode()
            if key:
                with service.lock:
                    service.keys[key].status, service.keys[key].body = 200, response
            if step == "drop":
                # The effect is done and saved; the client never hears of it.
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.answer(200, None, raw=response)

        def answer_saved(self, saved: Saved, fingerprint: str) -> None:
            if saved.fingerprint != fingerprint:
                message = (
                    "Keys for idempotent requests can only be used with the same parameters they were first used with."
                )
                self.answer(400, {"error": {"type": "idempotency_error", "message": message}})
            elif saved.status is None:
                service.conflicts.set()
                self.answer(409, {"error": {"type": "idempotency_error", "message":
                    "There is currently another in-progress request using this idempotency key."}})  # fmt: skip
            else:
                self.answer(saved.status, None, raw=saved.body, replayed=True)

    return Handler


if __name__ == "__main__":
    with Service() as running:
        print(running.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


def count_charges(run_dir: Any, args: Any, call_id: str) -> int:
    """The conformance kit's ``--counter``: the charges the service at ``CALLPROOF_HTTP_URL`` made under the call_id."""
    import os
    import urllib.request

    parts = urllib.parse.urlsplit(os.environ["CALLPROOF_HTTP_URL"])
    query = urllib.parse.urlencode({"idempotency_key": call_id})
    with urllib.request.urlopen(f"{parts.scheme}://{parts.netloc}/test/count?{query}", timeout=10) as answer:  # noqa: S310 - loopback
        return int(json.load(answer)["charges"])
