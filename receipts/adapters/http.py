"""An HTTP request as a tool's effect, sent with ``Idempotency-Key: <call_id>``. Standard library only (urllib).

The service keeps the key (as Stripe does, for 24 hours): the same key with
the same body is answered from the saved response and does nothing again. So
a lost answer (the connection dropped, a timeout, a 5xx) is retried here with
the same key, and a writer that resumes a call in doubt can ask the service,
when it offers a lookup, whether the key's request took effect.

What an answer means: 2xx, done (the resource id is read from the body).
409, the key's first request is still running: retried, and in doubt if it
stays so. 429, refused before anything ran: ``Rejected`` (retryable). Any
other 4xx, the request was refused (invalid, not allowed, or the key was used
with another request: 400/422): ``Rejected`` (permanent), nothing of this
request ran. 5xx, a timeout or a dropped connection after sending: the effect
may have happened: retried with the same key, then ``OutcomeUnknown``. Once
one try may have reached the service, no later answer can say "nothing
happened": it is ``OutcomeUnknown`` unless a 2xx says done.

A lookup's 404 says "never done" only while the service still keeps the key
(``key_retention``, 24 hours by default, as Stripe; ``None`` for a service that
keeps keys for ever): past it, or when the call's receipt is dated in the
future of this clock, a 404 may be a key forgotten, and a person decides.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import os
import string
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.confined import read_json_file
from receipts.tools import ABSENT, NOT_DONE, PRESENT, UNCLEAR, Evidence, OutcomeUnknown, Rejected, short_text

__all__ = ["HttpRequest", "http_factory"]

IDEMPOTENCY_KEY = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"  # the header with which a Stripe-like service says "answered from the key"
_LOOKUP_FIELDS = ("call_id", "resource_id")
# How long a Stripe-like service keeps an idempotency key.
KEY_RETENTION = 24 * 3600.0
# A receipt dated this far in the future of the clock comes from a clock that ran ahead, or this
# one was set back: the call's age is unknown.
CLOCK_SLACK = dt.timedelta(minutes=5)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, never followed: the request goes only to the configured address."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


class _Lost(Exception):  # noqa: N818 - a lost answer, not our failure
    """No answer: ``sent`` says whether the request may have reached the service."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


def _resource_id(document: Any, pointer: str) -> Any:
    """The value at a JSON pointer (``/data/id``) or top-level key (``id``); ``None`` when absent."""
    if not pointer.startswith("/"):
        return document.get(pointer) if isinstance(document, dict) else None
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(document, dict):
            document = document.get(token)
        elif isinstance(document, list) and token.isdigit() and int(token) < len(document):
            document = document[int(token)]
        else:
            return None
    return document


class HttpRequest:
    """Sends ``args`` as a JSON body to the configured ``url`` with the call_id as ``Idempotency-Key``.

    ``resource_id``: where the response body names the created resource (a
    JSON pointer, ``/data/id``, or a key, ``id``). ``lookup_url``: a URL
    template with ``{call_id}`` (the service finds a request by its key: the
    adapter can then answer a call in doubt) or ``{resource_id}`` (it finds a
    resource by id: the writer can check a commit). ``headers``: fixed headers
    (an ``Authorization``), never recorded. Nothing of a call's args or a
    receipt chooses the address.
    """

    def __init__(
        self,
        *,
        name: str,
        url: str,
        method: str = "POST",
        version: str = "1.0.0",
        resource_id: str = "id",
        lookup_url: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        retries: int = 2,
        retry_wait: float = 0.5,
        key_retention: float | None = KEY_RETENTION,
        clock: Callable[[], dt.datetime] = protocol.utc_now,
    ) -> None:
        for address in (url, lookup_url or url):
            if urllib.parse.urlsplit(address).scheme not in ("http", "https"):
                raise ValueError(f"an http(s) URL is needed, not {address!r}")
        self.lookup_by: str | None = None
        if lookup_url is not None:
            fields = {field for _, field, _, _ in string.Formatter().parse(lookup_url) if field is not None}
            if len(fields) != 1 or not fields <= set(_LOOKUP_FIELDS):
                raise ValueError("lookup_url must hold exactly one of {call_id} or {resource_id}")
            self.lookup_by = fields.pop()
        self.name, self.version, self.url, self.method = name, version, url, method.upper()
        self.resource_pointer, self.lookup_url = resource_id, lookup_url
        self.headers = dict(headers or {})
        self.timeout, self.retries, self.retry_wait = timeout, retries, retry_wait
        if key_retention is not None and not key_retention > 0:
            raise ValueError("key_retention must be a positive number of seconds, or None for keys kept for ever")
        self.key_retention, self.clock = key_retention, clock
        if self.lookup_by != "call_id":
            # Queryable only when the service can find a request by its key (``adapter_can_query``).
            self.query = None  # type: ignore[assignment]
        # Without a lookup nothing can look at the service: a commit is reused from its receipt
        # (checked: its identity and its result's digest), and ``evidence`` says where a person
        # would look, for the panel. With one, the writer asks the service before every reuse.
        self.checks_commits = lookup_url is not None

    # --- sending ----------------------------------------------------------------

    def _send(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]) -> tuple[int, Any, Any]:
        """(status, headers, parsed JSON body or None), or ``_Lost``."""
        # http(s) only: the configured URLs are checked in __init__, and a lookup's value is quoted.
        request = urllib.request.Request(url, data=body, method=method, headers={**self.headers, **headers})  # noqa: S310
        try:
            response = _OPENER.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as answer:
            response = answer
        except urllib.error.URLError as error:
            # urllib wraps only what fails before the request is wholly sent (no address, a refused
            # or cut connection while sending): a service never runs a request it did not receive whole.
            raise _Lost(f"{type(error.reason).__name__}: {error.reason}", sent=False) from None
        except (OSError, http.client.HTTPException) as error:
            raise _Lost(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__, sent=True) from None
        with response:
            try:
                data = response.read()
            except (OSError, http.client.HTTPException) as error:
                raise _Lost(f"the answer was cut: {type(error).__name__}", sent=True) from None
            try:
                document = json.loads(data) if data else None
            except ValueError:
                document = None
            return response.status, response.headers, document

    def _where(self, url: str) -> str:
        parts = urllib.parse.urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}{parts.path}"  # no query: it may carry a token

    def where_to_look(self, call_id: str, result: Any = None) -> str:
        recorded = result.get("resource_id") if isinstance(result, Mapping) else None
        found = f"; the receipt records resource id {short_text(recorded, 80)}" if recorded is not None else ""
        return f"look in the service at {self.method} {self._where(self.url)} for the request with " \
               f"{IDEMPOTENCY_KEY}: {call_id}{found}"  # fmt: skip

    # --- the adapter -------------------------------------------------------------

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(args, Mapping):
            raise Rejected("args must be a JSON object (the request's body)")
        try:
            return dict(json.loads(json.dumps(dict(args), allow_nan=False)))
        except (TypeError, ValueError) as error:
            raise Rejected(f"args are not JSON: {error}") from None

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        # The same bytes on every try: the service compares a retry's body with the first one's.
        body = json.dumps(args, sort_keys=True, separators=(",", ":")).encode()
        headers = {IDEMPOTENCY_KEY: call_id, "Content-Type": "application/json", "Accept": "application/json"}
        maybe_sent, last = False, ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.retry_wait * attempt)
            try:
                status, answer_headers, document = self._send(self.method, self.url, body, headers)
            except _Lost as lost:
                maybe_sent = maybe_sent or lost.sent
                last = f"no answer ({lost})"
                continue
            maybe_sent = True
            if 200 <= status < 300:
                result = {"status": status, "resource_id": _resource_id(document, self.resource_pointer),
                          "idempotency_key": call_id}  # fmt: skip
                if str(answer_headers.get(REPLAYED, "")).lower() == "true":
                    result["replayed"] = True
                return result
            last = f"HTTP {status}: {short_text(document, 200) if document is not None else 'no JSON body'}"
            if status == 409 or status >= 500:
                continue  # the key's first request still running, or a failure that may come after the effect
            if attempt == 0 and status == 429:
                raise Rejected(f"the service refused it for now ({last})", kind="retryable")
            if attempt == 0 and 400 <= status < 500:
                raise Rejected(f"the service refused the request ({last})")
            break
        if not maybe_sent:
            raise Rejected(f"the service could not be reached ({last})", kind="retryable")
        raise OutcomeUnknown(f"{self.method} {self._where(self.url)} with {IDEMPOTENCY_KEY} {call_id}: {last}")

    def _lookup(self, value: str) -> tuple[int, Any]:
        assert self.lookup_url is not None and self.lookup_by is not None
        url = self.lookup_url.format(**{self.lookup_by: urllib.parse.quote(value, safe="")})
        status, _, document = self._send("GET", url, None, {"Accept": "application/json"})
        return status, document

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any] | object:
        """By the key: the result when the service shows the key's resource, ``NOT_DONE`` on its 404."""
        try:
            status, document = self._lookup(call_id)
        except _Lost as lost:
            raise OutcomeUnknown(f"the lookup got no answer: {lost}") from None
        if status == 404:
            forgotten = self._may_have_forgotten(run_dir, call_id)
            if forgotten is not None:
                raise OutcomeUnknown(f"the lookup found nothing, and {forgotten}")
            return NOT_DONE
        if status != 200:
            raise OutcomeUnknown(f"the lookup answered HTTP {status}")
        return {"status": status, "resource_id": _resource_id(document, self.resource_pointer),
                "idempotency_key": call_id, "found_by": "lookup"}  # fmt: skip

    def evidence(
        self, run_dir: Path, args: Mapping[str, Any], call_id: str, result: Mapping[str, Any] | None = None
    ) -> Evidence:
        """What the service's lookup shows, read only (a GET); without one, what to look for."""
        look = self.where_to_look(call_id, result)
        recorded = result.get("resource_id") if isinstance(result, Mapping) else None
        if self.lookup_by == "call_id":
            value = call_id
        elif self.lookup_by == "resource_id" and isinstance(recorded, (str, int)):
            value = str(recorded)
        else:
            return Evidence(UNCLEAR, (f"this service offers no lookup here: {look}",))
        try:
            status, document = self._lookup(value)
        except _Lost as lost:
            return Evidence(UNCLEAR, (f"the lookup got no answer: {lost}", look))
        where = self._where(self.lookup_url or "")
        if status == 404:
            not_found = f"GET {where} ({self.lookup_by} {short_text(value, 80)}): 404, not found"
            forgotten = self._may_have_forgotten(run_dir, call_id) if self.lookup_by == "call_id" else None
            if forgotten is not None:
                return Evidence(UNCLEAR, (not_found, f"{forgotten}: not found may mean forgotten", look))
            verdict = ABSENT if self.lookup_by == "call_id" else UNCLEAR
            return Evidence(verdict, (not_found, look))
        if status != 200:
            return Evidence(UNCLEAR, (f"GET {where}: HTTP {status}", look))
        found = _resource_id(document, self.resource_pointer)
        fact = f"GET {where} ({self.lookup_by} {short_text(value, 80)}): resource {short_text(found, 80)}"
        if result is not None and found != recorded:
            return Evidence(UNCLEAR, (fact, f"the receipt records resource id {short_text(recorded, 80)}"))
        return Evidence(PRESENT, (fact,))

    def _may_have_forgotten(self, run_dir: Path, call_id: str) -> str | None:
        """Why the service's "not found" for this key may be a key it forgot, or ``None`` while it
        keeps it. The call was sent after its receipt was first written (``created_at``): a key
        is as old as that at most."""
        if self.key_retention is None:
            return None
        kept = _hours(self.key_retention)
        try:
            receipt = read_json_file(Path(run_dir) / "receipts" / f"{call_id}.json", Path(run_dir))
            if receipt is None:
                return None  # no receipt: the writer never sent this call (it writes one first)
            first_written = protocol.parse_time(receipt.get("created_at") if isinstance(receipt, dict) else None)
        except ValueError:
            return f"the call's receipt gives no time it was first written, and the service keeps a key for {kept}"
        age = self.clock() - first_written
        if age < -CLOCK_SLACK:
            return f"the call's receipt is dated {_hours(-age.total_seconds())} in the future of this clock"
        # A tenth of the retention, an hour at most, for the service's own clock.
        margin = min(self.key_retention / 10, 3600.0)
        if age.total_seconds() > self.key_retention - margin:
            return (
                f"the service keeps an idempotency key for {kept}, and this call was first sent "
                f"{_hours(age.total_seconds())} ago: it may have forgotten it"
            )
        return None

    def describe(self, args: Any) -> str:
        return (
            f"{self.method} {self._where(self.url)} with {IDEMPOTENCY_KEY} = the call_id, body {short_text(args, 300)}"
        )


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.3g} h" if seconds >= 3600 else f"{seconds / 60:.3g} min"


def http_factory() -> HttpRequest:
    """``http_request`` to ``CALLPROOF_HTTP_URL`` (POST, JSON body, resource id at ``id``), looked up by
    ``CALLPROOF_HTTP_LOOKUP_URL`` when set (a template with ``{call_id}`` or ``{resource_id}``)."""
    url = os.environ.get("CALLPROOF_HTTP_URL")
    if not url:
        raise ValueError("CALLPROOF_HTTP_URL must name the service's URL (http://127.0.0.1:PORT/v1/charges)")
    return HttpRequest(name="http_request", url=url, lookup_url=os.environ.get("CALLPROOF_HTTP_LOOKUP_URL") or None)
