"""Keyset (cursor) pagination: a deep page costs what the first page costs.

An OFFSET page makes the database walk every row before it, and a page count
makes it count them all: on a ledger of a million events both are seconds.
Here a page is "the next ``per_page`` rows after this key", one range scan on
an index, and totals come from the counts kept at import time.

A list is one or more *segments* shown one after the other: querysets, each
ordered by its own keys (the recovery page shows one segment per decision, most
urgent first; the inbox one per kind of item, of two models). A key that can
be NULL puts its NULL rows in a segment of their own, ordered by other keys:
NULL has no place in a range. A cursor names a segment and the keys of a row
in it:

    ?page=first | last | after.<segment>.<keys> | before.<segment>.<keys>

where ``<keys>`` is the row's key values (numbers, text, times in ISO 8601) as
base64url JSON. Anything else in ``page`` is a 400 that says so, as a bad
filter is. This is the only pagination: every list of the site, its CSV and
JSON twins (``every_row``) and the API walk the same segments.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import urlencode

from django.db import models
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_noop

from evidence.lib.refused import Refused
from receipts import protocol

PER_PAGE = 50
CHUNK = 1000  # rows a twin reads at a time


@dataclasses.dataclass(frozen=True)
class Segment:
    """Rows ordered by ``keys`` (the last of them unique within ``rows``), shown as ``present``
    makes them: a function of one page's rows of this segment, in order, to what the page lists
    (a row stands for itself when there is none)."""

    rows: QuerySet
    keys: tuple[str, ...]
    present: Callable[[list[Any]], list[Any]] | None = None

    def shown(self, rows: list[Any]) -> list[Any]:
        return self.present(rows) if self.present is not None and rows else rows


Segments = QuerySet | Segment | Sequence[QuerySet] | Sequence[Segment]


def as_segments(segments: Segments, keys: Sequence[str] | None = None) -> list[Segment]:
    """Querysets (all ordered by ``keys``) or segments, as segments."""
    listed: Sequence[QuerySet | Segment] = [segments] if isinstance(segments, QuerySet | Segment) else segments
    made = []
    for segment in listed:
        if isinstance(segment, Segment):
            made.append(segment)
        elif keys is None:
            raise TypeError("querysets are paged by the keys given with them")
        else:
            made.append(Segment(segment, tuple(keys)))
    return made


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return value


def _encode(values: Sequence[Any]) -> str:
    plain = [_plain(value) for value in values]
    return base64.urlsafe_b64encode(json.dumps(plain, separators=(",", ":")).encode()).decode().rstrip("=")


def _decode(text: str, width: int) -> list[Any]:
    try:
        values = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError) as error:
        raise Refused(gettext_noop("the page cursor is not one this site made")) from error
    if not isinstance(values, list) or len(values) != width or not all(isinstance(v, str | int) for v in values):
        raise Refused(gettext_noop("the page cursor is not one this site made"))
    return values


def _typed(model: Any, keys: Sequence[str], values: Sequence[Any], param: str) -> list[Any]:
    """Each value of the right kind for its column, a time made a time again: a string where the
    key is a number (or a number past 64 bits, or a NUL) would reach the database, and PostgreSQL
    refuses it with a 500."""
    typed = []
    for key, value in zip(keys, values, strict=True):
        field = model._meta.get_field(key.lstrip("-"))
        if field.is_relation:
            field = field.target_field
        if isinstance(field, models.IntegerField):
            fits = isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
        elif isinstance(field, models.DateTimeField):
            value = _moment(value)
            fits = value is not None
        else:
            fits = isinstance(value, str) and "\x00" not in value
        if not fits:
            raise Refused(gettext_noop("{param}: the page cursor is not one this site made"), param=param)
        typed.append(value)
    return typed


def _moment(value: Any) -> dt.datetime | None:
    """A cursor's time, in UTC; None for one with no zone or no UTC form Python can hold
    (``0001-01-01T00:00+14:00``), which the database adapter would raise on: a 500."""
    try:
        return protocol.parse_time(value)
    except ValueError:
        return None


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
        if self.newer is not None:  # not the first page
            links += [("first", self.first_url), ("prev", self.url(self.newer))]
        links.append(("position", ""))
        if self.older is not None:  # not the last page
            links += [("next", self.url(self.older)), ("last", self.last_url)]
        return links


def cursor_page(
    request: HttpRequest,
    segments: Segments,
    *,
    keys: Sequence[str] | None = None,
    param: str = "page",
    per_page: int = PER_PAGE,
    total: int | None = None,
    query: str = "",
    start: Sequence[Any] | None = None,
) -> CursorPage:
    """The page of ``segments`` that ``request.GET[param]`` names (the first when it names none).

    ``keys``: the order of querysets given as they are (segments carry their own). They must
    identify a row within a segment (end with a unique column). ``start``: key values of the
    first segment to begin at (inclusive) when no cursor is given, as a "go to" box does.
    Each page is at most one query per segment it reaches.
    """
    walked = as_segments(segments, keys)
    raw = request.GET.get(param) or "first"
    if raw == "first" and start is not None and walked:
        # Inclusive: begin with the row that has these keys, if there is one.
        from_start = _beyond(walked[0].keys, start, forward=True, inclusive=True)
        rows = _walk(walked, 0, from_start, forward=True, limit=per_page + 1)
        return _page(walked, rows, param, query, total, per_page, forward=True, came_from_cursor=True)
    if raw in ("first", "last"):
        forward = raw == "first"
        origin = 0 if forward else len(walked) - 1
        rows = _walk(walked, origin, None, forward=forward, limit=per_page + 1)
        return _page(walked, rows, param, query, total, per_page, forward=forward, came_from_cursor=False)
    direction, _, rest = raw.partition(".")
    segment_text, _, values_text = rest.partition(".")
    if direction not in ("after", "before") or not segment_text.isdigit() or int(segment_text) >= len(walked):
        raise Refused(gettext_noop("{page} is not a page of this list"), page=f"{param}={raw[:80]!r}")
    forward = direction == "after"
    segment = walked[int(segment_text)]
    values = _typed(segment.rows.model, segment.keys, _decode(values_text, len(segment.keys)), param)
    condition = _beyond(segment.keys, values, forward=forward)
    rows = _walk(walked, int(segment_text), condition, forward=forward, limit=per_page + 1)
    return _page(walked, rows, param, query, total, per_page, forward=forward, came_from_cursor=True)


def first_rows(segments: Segments, limit: int, keys: Sequence[str] | None = None) -> list[Any]:
    """The first ``limit`` rows of a list, as its first page shows them (a preview elsewhere)."""
    walked = as_segments(segments, keys)
    return _shown(walked, _walk(walked, 0, None, forward=True, limit=limit))


def every_row(segments: Segments, keys: Sequence[str] | None = None) -> Iterator[Any]:
    """Every row of a list in its order, as its pages show them, read ``CHUNK`` rows at a time
    by key (as the pages are: no OFFSET, no open cursor between chunks)."""
    for segment in as_segments(segments, keys):
        condition = None
        while True:
            rows = _walk([segment], 0, condition, forward=True, limit=CHUNK)
            yield from _shown([segment], rows)
            if len(rows) < CHUNK:
                break
            last = [getattr(rows[-1][1], key.lstrip("-")) for key in segment.keys]
            condition = _beyond(segment.keys, last, forward=True)


def _walk(
    segments: list[Segment], origin: int, condition: Q | None, *, forward: bool, limit: int
) -> list[tuple[int, Any]]:
    """Up to ``limit`` rows from segment ``origin`` on (past ``condition`` in it), in walking order."""
    indexes = range(origin, len(segments)) if forward else range(origin, -1, -1)
    rows: list[tuple[int, Any]] = []
    for index in indexes:
        segment = segments[index]
        order = list(segment.keys) if forward else _reverse(segment.keys)
        items = segment.rows
        if index == origin and condition is not None:
            items = items.filter(condition)
        rows += [(index, row) for row in items.order_by(*order)[: limit - len(rows)]]
        if len(rows) >= limit:
            break
    return rows


def _shown(segments: list[Segment], rows: list[tuple[int, Any]]) -> list[Any]:
    """Rows in order, each run of one segment's rows as that segment presents them."""
    shown = []
    for index, group in itertools.groupby(rows, key=lambda pair: pair[0]):
        shown += segments[index].shown([row for _, row in group])
    return shown


def _page(
    segments: list[Segment],
    rows: list[tuple[int, Any]],
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
        return f"{direction}.{index}.{_encode([getattr(row, key.lstrip('-')) for key in segments[index].keys])}"

    # Walking forward, a further page exists past the last row when more rows came; a page
    # before exists when a cursor brought us here. Walking backward, the other way round.
    has_before = (more if not forward else came_from_cursor) and bool(rows)
    has_after = (more if forward else came_from_cursor) and bool(rows)
    return CursorPage(
        object_list=_shown(segments, rows),
        param=param,
        query=query,
        newer=cursor("before", *rows[0]) if has_before else None,
        older=cursor("after", *rows[-1]) if has_after else None,
        total=total,
        is_first=not has_before,
        is_last=not has_after,
    )
