"""Keyset (cursor) pagination: a deep page costs what the first page costs.

An OFFSET page makes the database walk every row before it, and a page count
makes it count them all: on a ledger of a million events both are seconds.
Here a page is "the next ``per_page`` rows after this key", one range scan on
an index, and totals come from the counts kept at import time.

A list is one or more *segments*, querysets ordered by the same keys and shown
one after the other (the recovery page shows one segment per decision, most
urgent first). A cursor names a segment and the keys of a row in it:

    ?page=first | last | after.<segment>.<keys> | before.<segment>.<keys>

where ``<keys>`` is the row's key values as base64url JSON. Anything else in
``page`` is a 400 that says so, as a bad filter is.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

from django.core.exceptions import BadRequest
from django.db import models
from django.db.models import Q, QuerySet
from django.http import HttpRequest

PER_PAGE = 50


def _encode(values: Sequence[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(values), separators=(",", ":")).encode()).decode().rstrip("=")


def _decode(text: str, width: int) -> list[Any]:
    try:
        values = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError) as error:
        raise BadRequest("the page cursor is not one this site made") from error
    if not isinstance(values, list) or len(values) != width or not all(isinstance(v, str | int) for v in values):
        raise BadRequest("the page cursor is not one this site made")
    return values


def _check_types(model: Any, keys: Sequence[str], values: Sequence[Any], param: str) -> None:
    """Each value of the right kind for its column: a string where the key is a number (or a
    number past 64 bits, or a NUL) would reach the database, and PostgreSQL refuses it with a 500."""
    for key, value in zip(keys, values, strict=True):
        numeric = isinstance(model._meta.get_field(key.lstrip("-")), models.IntegerField)
        fits = (
            isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
            if numeric
            else isinstance(value, str) and "\x00" not in value
        )
        if not fits:
            raise BadRequest(f"{param}: the page cursor is not one this site made")


def _beyond(keys: Sequence[str], values: Sequence[Any], *, forward: bool, inclusive: bool = False) -> Q:
    """Rows after (``forward``) or before the row with ``values`` in ``keys`` order, and that
    row too when ``inclusive``: (a > x) OR (a = x AND b > y) ..., which each database turns
    into an index range (a negated condition it would not)."""
    condition = Q()
    for index, key in enumerate(keys):
        name = key.lstrip("-")
        ascending = not key.startswith("-")
        lookup = "gt" if ascending == forward else "lt"
        if inclusive and index == len(keys) - 1:
            lookup += "e"
        step = Q(**{f"{name}__{lookup}": values[index]})
        for earlier, value in zip(keys[:index], values[:index], strict=False):
            step &= Q(**{earlier.lstrip("-"): value})
        condition |= step
    return condition


def _reverse(keys: Sequence[str]) -> list[str]:
    return [key[1:] if key.startswith("-") else f"-{key}" for key in keys]


@dataclasses.dataclass
class CursorPage:
    """One page of a keyset-paginated list, with the links a person follows from it."""

    object_list: list[Any]
    param: str
    query: str  # the rest of the query string, kept in every link
    newer: str | None  # the cursor of the page before this one, if there is one
    older: str | None  # the cursor of the page after it
    total: int | None  # the whole list's length, when it is known without counting
    is_first: bool
    is_last: bool

    def url(self, cursor: str) -> str:
        rest = f"{self.query}&" if self.query else ""
        return "?" + rest + urlencode({self.param: cursor})

    @property
    def first_url(self) -> str:
        return self.url("first")

    @property
    def last_url(self) -> str:
        return self.url("last")

    @property
    def newer_url(self) -> str | None:
        return None if self.newer is None else self.url(self.newer)

    @property
    def older_url(self) -> str | None:
        return None if self.older is None else self.url(self.older)

    @property
    def has_other_pages(self) -> bool:
        return not (self.is_first and self.is_last)

    @property
    def links(self) -> list[tuple[str, str]]:
        """(rel, url) in reading order; "position" marks where the count goes."""
        links = []
        if not self.is_first:
            links += [("first", self.first_url), ("prev", self.newer_url)]
        links.append(("position", ""))
        if not self.is_last:
            links += [("next", self.older_url), ("last", self.last_url)]
        return links


def cursor_page(
    request: HttpRequest,
    segments: QuerySet | Sequence[QuerySet],
    *,
    keys: Sequence[str],
    param: str = "page",
    per_page: int = PER_PAGE,
    total: int | None = None,
    query: str = "",
    start: Sequence[Any] | None = None,
) -> CursorPage:
    """The page of ``segments`` that ``request.GET[param]`` names (the first when it names none).

    ``keys`` must identify a row within a segment (end with a unique column).
    ``start``: key values to begin at (inclusive) when no cursor is given, as a "go to" box does.
    Each page is at most one query per segment it reaches.
    """
    segments = [segments] if isinstance(segments, QuerySet) else list(segments)
    raw = request.GET.get(param) or "first"
    if raw == "first" and start is not None and segments:
        # Inclusive: begin with the row that has these keys, if there is one.
        from_start = _beyond(keys, start, forward=True, inclusive=True)
        rows = _walk(segments, keys, 0, from_start, forward=True, limit=per_page + 1)
        return _page(rows, keys, param, query, total, per_page, forward=True, came_from_cursor=True)
    if raw in ("first", "last"):
        forward = raw == "first"
        origin = 0 if forward else len(segments) - 1
        rows = _walk(segments, keys, origin, None, forward=forward, limit=per_page + 1)
        return _page(rows, keys, param, query, total, per_page, forward=forward, came_from_cursor=False)
    direction, _, rest = raw.partition(".")
    segment_text, _, values_text = rest.partition(".")
    if direction not in ("after", "before") or not segment_text.isdigit() or int(segment_text) >= len(segments):
        raise BadRequest(f"{param}={raw[:80]!r} is not a page of this list")
    forward = direction == "after"
    values = _decode(values_text, len(keys))
    if segments:
        _check_types(segments[0].model, keys, values, param)
    rows = _walk(
        segments, keys, int(segment_text), _beyond(keys, values, forward=forward), forward=forward, limit=per_page + 1
    )
    return _page(rows, keys, param, query, total, per_page, forward=forward, came_from_cursor=True)


def _walk(
    segments: list[QuerySet], keys: Sequence[str], origin: int, condition: Q | None, *, forward: bool, limit: int
) -> list[tuple[int, Any]]:
    """Up to ``limit`` rows from segment ``origin`` on (past ``condition`` in it), in walking order."""
    order = list(keys) if forward else _reverse(keys)
    indexes = range(origin, len(segments)) if forward else range(origin, -1, -1)
    rows: list[tuple[int, Any]] = []
    for index in indexes:
        items = segments[index]
        if index == origin and condition is not None:
            items = items.filter(condition)
        rows += [(index, row) for row in items.order_by(*order)[: limit - len(rows)]]
        if len(rows) >= limit:
            break
    return rows


def _page(
    rows: list[tuple[int, Any]],
    keys: Sequence[str],
    param: str,
    query: str,
    total: int | None,
    per_page: int,
    *,
    forward: bool,
    came_from_cursor: bool,
) -> CursorPage:
    more = len(rows) > per_page
    rows = rows[:per_page]
    if not forward:
        rows.reverse()

    def cursor(direction: str, index: int, row: Any) -> str:
        return f"{direction}.{index}.{_encode([getattr(row, key.lstrip('-')) for key in keys])}"

    # Walking forward, a further page exists past the last row when more rows came; a page
    # before exists when a cursor brought us here. Walking backward, the other way round.
    has_before = (more if not forward else came_from_cursor) and bool(rows)
    has_after = (more if forward else came_from_cursor) and bool(rows)
    return CursorPage(
        object_list=[row for _, row in rows],
        param=param,
        query=query,
        newer=cursor("before", *rows[0]) if has_before else None,
        older=cursor("after", *rows[-1]) if has_after else None,
        total=total,
        is_first=not has_before,
        is_last=not has_after,
    )
