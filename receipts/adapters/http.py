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
keeps keys for ever), and the key's age is judged by the service's own clock
(the ``Date`` of its answers), never this host's: a host whose clock is wrong
at the send or at the resume cannot make a forgotten key look kept. Before the
first send the service's clock is read (a GET of the lookup), and a call whose
receipt is dated more than ``CLOCK_SLACK`` ahead of it is not sent
(``Rejected``, retryable): the receipt's ``created_at``, less ``CLOCK_SLACK``,
is then no later than the key was made, by the service's clock. Past the
retention by it, with no ``Date`` to judge by, or when the receipt is dated in
the future of the service's clock, a 404 may be a key forgotten: a call in
doubt goes to a person, and a commit stays a commit when its receipt and the
run's ledger both record it (never sent again).
"""

from __future__ import annotations

import datetime as dt
import email.utils
import http.client
import json
import os
import string
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.confined import read_json_file
from receipts.durable import read_events
from receipts.tools import ABSENT, NOT_DONE, PRESENT, UNCLEAR, Evidence, OutcomeUnknown, Rejected, short_text

__all__ = ["HttpRequest", "http_factory"]

IDEMPOTENCY_KEY = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"  # the header with which a Stripe-like service says "answered from the key"
_LOOKUP_FIELDS = ("call_id", "resource_id")
# How long a Stripe-like service keeps an idempotency key.
KEY_RETENTION = 24 * 3600.0
# How far ahead of the service's clock a call's receipt may be dated when it is sent (a receipt
# dated further is not sent); and, at a lookup, a receipt dated that far in the future of the
# service's clock means a clock set back (or a receipt sent without that check): its age is unknown.
CLOCK_SLACK = dt.timedelta(minutes=5)
# How long a reading of the service's clock (an answer's Date) serves the sends that follow it,
# aged on this process's monotonic clock, before the service is asked again.
CLOCK_READING_SECONDS = 60.0


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
        self.key_retention = key_retention
        # The service's clock as last read: (its Date, time.monotonic() when the answer came).
        self._clock_reading: tuple[dt.datetime, float] | None = None
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
        self._check_receipt_date(run_dir, call_id)
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
                self._read_date(answer_headers)
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

    def _lookup(self, value: str) -> tuple[int, dt.datetime | None, Any]:
        """(status, the service's Date when it answered 200 or 404, parsed JSON body or None), or ``_Lost``."""
        assert self.lookup_url is not None and self.lookup_by is not None
        url = self.lookup_url.format(**{self.lookup_by: urllib.parse.quote(value, safe="")})
        status, headers, document = self._send("GET", url, None, {"Accept": "application/json"})
        # Only the lookup's own answers: another status may come from a proxy, with its own clock.
        return status, self._read_date(headers) if status in (200, 404) else None, document

    # --- the service's clock ---------------------------------------------------------

    def _read_date(self, headers: Any) -> dt.datetime | None:
        """The service's clock from an answer's ``Date`` (kept as the latest reading), or ``None``."""
        value = headers.get("Date") if headers is not None else None
        try:
            moment = email.utils.parsedate_to_datetime(value) if isinstance(value, str) else None
        except (TypeError, ValueError):
            moment = None
        if moment is None:
            return None
        moment = moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)
        self._clock_reading = (moment, time.monotonic())
        return moment

    def _service_now(self, call_id: str) -> dt.datetime:
        """No later than the service's clock now: a recent reading aged on the monotonic clock, or a
        lookup's Date. ``Rejected`` when the service gives none: nothing was sent."""
        reading = self._clock_reading
        if reading is not None and 0 <= time.monotonic() - reading[1] <= CLOCK_READING_SECONDS:
            # The Date is truncated to the second and was written before the answer came: the
            # service's clock is at least this now (unless it was set back since, as any clock may be).
            return reading[0] + dt.timedelta(seconds=time.monotonic() - reading[1])
        why = "it gave no Date"
        try:
            status, moment, _ = self._lookup(call_id)
        except _Lost as lost:
            raise Rejected(f"the service's clock could not be read before the send ({lost}): nothing was sent",
                           kind="retryable") from None  # fmt: skip
        if moment is not None:
            return moment
        if status not in (200, 404):
            why = f"the lookup answered HTTP {status}"
        raise Rejected(
            f"the service's clock could not be read before the send ({why}): a key it forgets could not be told "
            "from a call never made, so nothing was sent",
            kind="retryable",
        )

    def _check_receipt_date(self, run_dir: Path, call_id: str) -> None:
        """Before a send that a lookup may later judge by the key's age: the call's receipt may be
        dated no more than ``CLOCK_SLACK`` ahead of the service's clock, so that its ``created_at``,
        less ``CLOCK_SLACK``, is no later than the key is made, by the service's clock."""
        if self.lookup_by != "call_id" or self.key_retention is None:
            return  # a 404 is never read as "not done": the key's age is never judged
        try:
            first_written = self._first_written(run_dir, call_id)
        except ValueError:
            return  # a lookup's 404 for it is never "not done" (``_may_have_forgotten``)
        if first_written is None:
            return  # no receipt (the adapter called outside the writer): a 404 is read as the writer would
        ahead = first_written - self._service_now(call_id)
        if ahead > CLOCK_SLACK:
            raise Rejected(
                f"this call's receipt is dated {_hours(ahead.total_seconds())} ahead of the service's clock "
                f"(its Date): this host's clock runs ahead, and a key the service forgets could later pass for a "
                f"call never made. Nothing was sent: set the clock right and make the call again",
                kind="retryable",
            )

    def _first_written(self, run_dir: Path, call_id: str) -> dt.datetime | None:
        """The call's receipt's ``created_at``; ``None`` with no receipt, ``ValueError`` when it gives none."""
        receipt = read_json_file(Path(run_dir) / "receipts" / f"{call_id}.json", Path(run_dir))
        if receipt is None:
            return None
        return protocol.parse_time(receipt.get("created_at") if isinstance(receipt, dict) else None)

    # --- looking ----------------------------------------------------------------------

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any] | object:
        """By the key: the result when the service shows the key's resource, ``NOT_DONE`` on its 404."""
        try:
            status, service_now, document = self._lookup(call_id)
        except _Lost as lost:
            raise OutcomeUnknown(f"the lookup got no answer: {lost}") from None
        if status == 404:
            forgotten = self._may_have_forgotten(run_dir, call_id, service_now)
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
            status, service_now, document = self._lookup(value)
        except _Lost as lost:
            return Evidence(UNCLEAR, (f"the lookup got no answer: {lost}", look))
        where = self._where(self.lookup_url or "")
        if status == 404:
            not_found = f"GET {where} ({self.lookup_by} {short_text(value, 80)}): 404, not found"
            forgotten = self._may_have_forgotten(run_dir, call_id, service_now) if self.lookup_by == "call_id" else None
            if forgotten is not None:
                on_record = self._commit_on_record(run_dir, call_id, result) if result is not None else None
                if on_record is not None:
                    # A commit its key outlived: not found is no sign against it, and it is never sent again.
                    return Evidence(PRESENT, (not_found, f"{forgotten}: not found is no sign against it", on_record))
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

    def _may_have_forgotten(self, run_dir: Path, call_id: str, service_now: dt.datetime | None) -> str | None:
        """Why the service's "not found" for this key may be a key it forgot, or ``None`` while it
        keeps it, judged by the service's clock (``service_now``: the lookup's Date). The key was
        made no earlier than the receipt's ``created_at`` less ``CLOCK_SLACK`` by that clock (a
        receipt dated further ahead of it is never sent)."""
        if self.key_retention is None:
            return None
        kept = _hours(self.key_retention)
        try:
            first_written = self._first_written(run_dir, call_id)
        except ValueError:
            return f"the call's receipt gives no time it was first written, and the service keeps a key for {kept}"
        if first_written is None:
            return None  # no receipt: the writer never sent this call (it writes one first)
        if service_now is None:
            return f"the service's answer gives no Date to judge the key's age by, and it keeps a key for {kept}"
        age = service_now - first_written
        if age < -CLOCK_SLACK:
            return f"the call's receipt is dated {_hours(-age.total_seconds())} in the future of the service's clock"
        # At most: the slack the send allowed, and the second the Date leaves out.
        oldest = (age + CLOCK_SLACK).total_seconds() + 1
        # A tenth of the retention, an hour at most, for the service's clock set back or forward since.
        margin = min(self.key_retention / 10, 3600.0)
        if oldest > self.key_retention - margin:
            return (
                f"the service keeps an idempotency key for {kept}, and this call was first sent at most "
                f"{_hours(oldest)} ago by its clock: it may have forgotten it"
            )
        return None

    def _commit_on_record(self, run_dir: Path, call_id: str, result: Any) -> str | None:
        """What records this committed result, when the call's receipt (the result and its digest)
        and the run's ledger (the receipt's committed event) both do; ``None`` otherwise."""
        try:
            receipt = read_json_file(Path(run_dir) / "receipts" / f"{call_id}.json", Path(run_dir))
            if not (
                isinstance(receipt, dict)
                and receipt.get("call_id") == call_id
                and receipt.get("status") == "committed"
                and receipt.get("result") == result
                and receipt.get("output_sha256") == protocol.input_sha256(result)
            ):
                return None
            in_ledger = any(
                event.get("type") == "receipt"
                and event.get("call_id") == call_id
                and event.get("status") == "committed"
                for event in read_events(Path(run_dir))
            )
        except (OSError, ValueError):
            return None
        if not in_ledger:
            return None
        found = result.get("resource_id") if isinstance(result, Mapping) else None
        return f"the receipt and the ledger record the commit (resource id {short_text(found, 80)})"

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
