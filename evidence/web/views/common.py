"""What every page shares: access helpers, query parameters, and the CSV/JSON twin of each list."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponseRedirect, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.urls import ResolverMatch, reverse
from django.utils.translation import gettext_noop
from django_htmx.middleware import HtmxDetails

from evidence.lib.refused import Refused
from evidence.models import Call, Run
from evidence.review.listings import Listing, json_value
from receipts.protocol import MAX_INT


class HtmxHttpRequest(HttpRequest):
    """A request that went through django-htmx's middleware (for type checkers)."""

    htmx: HtmxDetails


def url_of(kind: str, run_id: str, key: str = "") -> str:
    """Where a run, a call or a submission is shown. A submission id is URL-encoded."""
    if kind == "call":
        return reverse("call", args=[run_id, key])
    url = reverse("run", args=[run_id])
    if kind == "submission":
        url += "?" + urlencode({"submission": key}) + "#submissions"
    return url


# The URLs that take only a POST (a form's action), each with the page that holds its form: where
# a person is sent back to when the answer to the POST cannot be asked for again (a CSRF refusal,
# a switch of language on a page that answered the POST).
FORM_PAGES = {
    "confirm": "call",
    "withdraw": "call",
    "notification_rule_add": "notifications",
    "legal_hold": "run",
    "export_request": "run",
    "triage_action": "triage",
    "claim": "inbox",
}


def form_page(match: ResolverMatch | None) -> str | None:
    """The page that holds the form posted to ``match``'s URL, when that URL takes only a POST."""
    page = FORM_PAGES.get(match.url_name or "") if match else None
    if page is None or match is None:
        return None
    return reverse(page, kwargs=match.kwargs)


FORMATS = ("csv", "json")


def see_other(url: str) -> HttpResponseRedirect:
    """Where a form's POST sends the browser, by a 303: it follows with a GET, so a reload of
    the page it lands on posts nothing again."""
    response = HttpResponseRedirect(url)
    response.status_code = HTTPStatus.SEE_OTHER
    return response


def get_run_or_404(run_id: str) -> Run:
    return get_object_or_404(Run, run_id=run_id)


def get_call_or_404(run: Run, call_id: str) -> Call:
    return get_object_or_404(Call, run=run, call_id=call_id)


def query_without(request: HttpRequest, *names: str) -> str:
    """The current query string without ``names`` (for links that change one of them)."""
    query = request.GET.copy()
    for name in names:
        query.pop(name, None)
    return query.urlencode()


def whole_number(request: HttpRequest, name: str) -> int | None:
    """A query parameter that must be a whole number from 0 up, when given; anything else is a 400."""
    value = request.GET.get(name, "").strip()
    if not value:
        return None
    if not (value.isascii() and value.isdigit()) or int(value) > MAX_INT:
        raise Refused(gettext_noop("{given} is not a whole number"), given=f"{name}={value[:80]!r}")
    return int(value)


# What a search box or a filter takes (a run_id is at most 128 characters, a user name 150):
# the boxes say it with ``maxlength``, and a longer one is a 400, not a scan for nothing.
TYPED_LIMIT = 200


def typed(request: HttpRequest, name: str) -> str:
    """A query parameter a person types (a search, a run or an actor to filter by): at most ``TYPED_LIMIT``."""
    value = request.GET.get(name, "")
    if len(value) > TYPED_LIMIT:
        raise Refused(gettext_noop("{name}: at most {limit} characters"), name=name, limit=TYPED_LIMIT)
    return value


def download_format(request: HttpRequest) -> str | None:
    return choice(request, "format", FORMATS) or None


def choice(request: HttpRequest, name: str, allowed: Iterable[str], default: str = "", *, form: bool = False) -> str:
    """A query parameter (or, with ``form``, a posted field, which is then required) that must be
    one of ``allowed``; anything else is a 400 that names them.

    A filter that is silently ignored shows a person a list they did not ask for.
    """
    value = (request.POST if form else request.GET).get(name)
    allowed = list(allowed)
    if (value is None or value == "") and not form:
        return default
    if value not in allowed:
        shown = ", ".join(allowed[:30]) + (", …" if len(allowed) > 30 else "")
        raise Refused(
            gettext_noop("{given} is not one of: {allowed}"), given=f"{name}={(value or '')[:80]!r}", allowed=shown
        )
    return value


# A spreadsheet runs a cell that starts with one of these as a formula (OWASP, "CSV injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell that no spreadsheet runs: text that could start a formula gets a
    leading apostrophe. Numbers stay numbers (a negative number is not text)."""
    if isinstance(value, dict | list):
        value = json.dumps(value, sort_keys=True, ensure_ascii=False)
    value = json_value(value)
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


class _Echo:
    def write(self, value: str) -> str:
        return value


def download(fmt: str, listing: Listing) -> StreamingHttpResponse:
    """Every item of a list as CSV (a column a field) or JSON (the API's shape, every item and no
    ``next``), streamed and read by key, so a long list never sits in memory."""
    if fmt == "csv":
        writer = csv.writer(_Echo())

        def lines() -> Iterable[str]:
            yield writer.writerow(listing.fields)
            for values in listing.rows():
                yield writer.writerow([csv_cell(value) for value in values])

        response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    else:

        def chunks() -> Iterable[str]:
            yield '{"items": ['
            count = 0
            for count, item in enumerate(listing.items(), start=1):
                yield ("," if count > 1 else "") + json.dumps(item, ensure_ascii=False)
            yield f'], "next": null, "total": {count}}}\n'

        response = StreamingHttpResponse(chunks(), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{listing.name}.{fmt}"'
    return response
