"""Small server-rendered SVG charts. No charting library: a chart is a few rectangles.

Each chart has a text alternative (``aria-label`` and a ``<title>`` per shape),
colours come from the stylesheet's classes so dark mode applies, and every
label is escaped.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping, Sequence

from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import get_language, pgettext
from django.utils.translation import gettext as _

from evidence.words import i18n
from receipts import states

# The states in the table's order (committed first, tampered and the settled ones after); a
# word that is not a state (a stored count from before the table) after them.
STATUS_ORDER = tuple(states.STATES)
# What a call can show as (``recovery.shown_status``), for the bars' key.
CALL_STATES = tuple(name for name in states.STATES if name not in (states.CONFLICT, states.STALE))


def fill_class(status: str) -> str:
    """A shown status as a class name: "settled: committed" is ``fill-settled-committed``."""
    return "fill-" + "-".join(status.replace(":", " ").split())


def _status_key(status: str) -> tuple[int, str]:
    return (STATUS_ORDER.index(status) if status in STATUS_ORDER else len(STATUS_ORDER), status)


# Each colour of the bar also has its own marks, drawn over the fill in the background's colour,
# so that the states part without colour (deuteranopia, greyscale): each state's marks are the
# table's (``receipts.states``); anything else is dotted. The legends' swatches
# (static/css/site.css) wear the same marks.
MARKS = {name: state.marks for name, state in states.STATES.items()}


def marks(kind: str, x: float, width: float, height: int) -> str:
    """The path data of a segment's marks, kept inside it; a sliver too thin for any gets none."""
    step, strokes = 5.0, []
    left = x + 1.5
    while left + 3 <= x + width - 1:
        if kind == "stripes":
            strokes.append(f"M{left:.2f} {height}L{left + 3:.2f} 0")
        elif kind == "crosses":
            top, bottom, right = f"{height * 0.2:.2f}", f"{height * 0.8:.2f}", f"{left + 3:.2f}"
            strokes.append(f"M{left:.2f} {top}L{right} {bottom}M{right} {top}L{left:.2f} {bottom}")
        elif kind == "dashes":
            strokes.append(f"M{left:.2f} {height / 2:.2f}h3")
        elif kind == "hatch":
            strokes.append(f"M{left:.2f} 0L{left + 3:.2f} {height}")
        elif kind == "ticks":
            strokes.append(f"M{left + 1.5:.2f} {height * 0.25:.2f}v{height * 0.5:.2f}")
        elif kind == "grid":
            strokes.append(f"M{left + 1.5:.2f} 0v{height}M{left:.2f} {height / 2:.2f}h3")
        elif kind == "rings":
            strokes.append(f"M{left:.2f} {height / 2:.2f}a1.5 1.5 0 1 0 3 0a1.5 1.5 0 1 0 -3 0")
        elif kind == "dots":
            strokes.append(f"M{left + 1:.2f} {height / 2:.2f}h1")
        left += step
    return "".join(strokes)


def status_bar(counts: Mapping[str, int], width: int = 140, height: int = 12) -> SafeString:
    """A stacked bar of calls by state, each state told by its colour and by its marks.

    Drawn once per counts, size and language (``_status_bar``): a page of runs shows the same
    few bars again and again, and a bar cost more to draw than the rest of its row."""
    return _status_bar(tuple(sorted(counts.items())), width, height, get_language())


@functools.lru_cache(maxsize=1024)
def _status_bar(counted: tuple[tuple[str, int], ...], width: int, height: int, language: str | None) -> SafeString:
    """``status_bar`` of ``dict(counted)``; ``language`` keys the cache (the words are the active
    language's)."""
    counts = dict(counted)
    total = sum(counts.values())
    summary = pgettext("list separator", ", ").join(
        _counted(count, status) for status, count in sorted(counts.items(), key=lambda i: _status_key(i[0]))
    )
    if not total:
        return format_html('<span class="muted">{}</span>', _("no calls"))
    x, shapes = 0.0, []
    for status, count in sorted(counts.items(), key=lambda item: _status_key(item[0])):
        share = width * count / total
        shapes.append(_segment(status, x, share, height, _counted(count, status)))
        x += share
    rects = format_html_join("", "{}", ((shape,) for shape in shapes))
    return format_html(
        '<svg class="chart" width="{}" height="{}" viewBox="0 0 {} {}" role="img" aria-label="{}">{}</svg>',
        width,
        height,
        width,
        height,
        _("calls: %(summary)s") % {"summary": summary},
        rects,
    )


def _segment(status: str, x: float, width: float, height: int, title: str) -> SafeString:
    """One state's rectangle in its tone's colour, with its marks over it."""
    state = states.STATES.get(status)
    tone = state.tone if state else "neutral"
    rect = format_html(
        '<rect x="{}" y="0" width="{}" height="{}" class="{} tone-{}"><title>{}</title></rect>',
        f"{x:.2f}", f"{width:.2f}", height, fill_class(status), tone, title,
    )  # fmt: skip
    kind = MARKS.get(status, "dots")
    if path := marks(kind, x, width, height):
        return format_html('{}<path class="mark mark-{}" d="{}"></path>', rect, kind, path)
    return rect


def state_legend(names: Sequence[str] = CALL_STATES) -> SafeString:
    """The bars' key: each state's swatch (drawn as the bar draws it) and its word."""
    items = (
        (
            format_html(
                '<svg class="chart swatch-svg" width="14" height="12" viewBox="0 0 14 12" aria-hidden="true">{}</svg>',
                _segment(name, 0, 14, 12, i18n.word(name)),
            ),
            i18n.word(name),
        )
        for name in names
    )
    return format_html(
        '<span class="legend-items">{}</span>',
        format_html_join(" ", '<span class="legend-item nowrap">{} {}</span>', items),
    )


def _counted(count: int, status: str) -> str:
    """ "3 committed": a count of calls and their status, in the reader's words."""
    return pgettext("calls of a status", "%(count)s %(status)s") % {"count": count, "status": i18n.word(status)}


def histogram(buckets: Sequence[tuple[dt.datetime, int]], width: int = 480, height: int = 64) -> SafeString:
    """Events per time slice, as bars; the first and last slice times are labelled."""
    if not buckets:
        return format_html('<span class="muted">{}</span>', _("no events"))
    peak = max(count for _, count in buckets) or 1
    bar = width / len(buckets)
    shapes = []
    for index, (start, count) in enumerate(buckets):
        bar_height = (height - 26) * count / peak  # 12 px above for the scale, 14 below for the times
        shapes.append(
            (
                f"{index * bar + 1:.2f}",
                f"{height - 14 - bar_height:.2f}",
                f"{max(bar - 2, 1):.2f}",
                f"{bar_height:.2f}",
                _("%(count)s events from %(start)s") % {"count": count, "start": f"{start:%Y-%m-%d %H:%M:%S}"},
            )
        )
    rects = format_html_join(
        "", '<rect x="{}" y="{}" width="{}" height="{}" class="fill-bar"><title>{}</title></rect>', shapes
    )
    total = sum(count for _, count in buckets)
    first, last = buckets[0][0], buckets[-1][0]
    slice_width = _duration(buckets[1][0] - buckets[0][0]) if len(buckets) > 1 else _("slice")
    return format_html(
        '<svg class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
        'aria-label="{label}">{rects}'
        '<text x="0" y="9" class="axis">{scale}</text>'
        '<text x="0" y="{ty}" class="axis">{first}</text>'
        '<text x="{w}" y="{ty}" class="axis" text-anchor="end">{last} UTC</text></svg>',
        w=width,
        h=height,
        label=_("%(total)s events over time, busiest slice %(peak)s") % {"total": total, "peak": peak},
        scale=_("%(peak)s events per %(slice)s") % {"peak": peak, "slice": slice_width},
        rects=rects,
        ty=height - 2,
        first=f"{first:%Y-%m-%d %H:%M}",
        last=f"{last:%Y-%m-%d %H:%M}",
    )


def _duration(width: dt.timedelta) -> str:
    """A slice's width in the largest unit that keeps it whole enough to read."""
    seconds = width.total_seconds()
    for unit, size in ((_("%(n)s day"), 86400), (_("%(n)s h"), 3600), (_("%(n)s min"), 60)):
        if seconds >= size:
            return unit % {"n": f"{seconds / size:.3g}"}
    if seconds >= 1:
        return _("%(n)s s") % {"n": f"{seconds:.3g}"}
    return _("%(n)s ms") % {"n": f"{seconds * 1000:.3g}"}


def activity_strip(
    first: dt.datetime | None,
    last: dt.datetime | None,
    span: tuple[dt.datetime, dt.datetime] | None,
    width: int = 120,
    height: int = 10,
) -> SafeString:
    """When a run was active, on the time axis shared by every run on the page."""
    if first is None or last is None or span is None:
        return format_html('<span class="muted">{}</span>', _("no events"))
    width, height = int(width), int(height)
    total = max((span[1] - span[0]).total_seconds(), 1.0)
    x = width * (first - span[0]).total_seconds() / total
    w = max(width * (last - first).total_seconds() / total, 2.0)
    label = _("active %(first)s to %(last)s") % {
        "first": f"{first:%Y-%m-%d %H:%M:%S}",
        "last": f"{last:%Y-%m-%d %H:%M:%S}",
    }
    title = _("%(first)s to %(last)s") % {"first": f"{first:%H:%M:%S}", "last": f"{last:%H:%M:%S}"}
    # A page of runs draws fifty of these: the numbers are made here, only the two texts need
    # escaping (format_html's escaping of all ten values cost more than the rest of the strip).
    return mark_safe(  # noqa: S308 - the texts are escaped, the rest are numbers made here
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(label)}"><rect x="0" y="{height // 2 - 1}" width="{width}" height="2" '
        f'class="fill-axis"></rect><rect x="{min(x, width - w):.2f}" y="0" width="{w:.2f}" height="{height}" '
        f'class="fill-bar"><title>{escape(title)}</title></rect></svg>'
    )
