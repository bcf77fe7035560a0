"""The SVG charts: shapes in proportion, labels escaped, a text alternative on each."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from evidence import charts

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def widths(svg: str) -> list[float]:
    return [float(width) for width in re.findall(r'<rect x="[^"]*" y="0" width="([^"]*)"', svg)]


def test_the_status_bar_stacks_statuses_in_the_protocols_order_and_in_proportion():
    svg = str(charts.status_bar({"rejected": 1, "committed": 3}, width=100))
    assert 'aria-label="calls: 3 committed, 1 rejected"' in svg
    assert widths(svg) == [75.0, 25.0]
    assert svg.index("fill-committed") < svg.index("fill-rejected")


def test_the_status_bar_of_no_call_says_so():
    assert "no calls" in str(charts.status_bar({}))


def test_an_unknown_status_goes_last_and_is_escaped():
    svg = str(charts.status_bar({"<b>odd</b>": 1, "prepared": 1}, width=100))
    assert "<b>" not in svg and "&lt;b&gt;odd&lt;/b&gt;" in svg
    assert svg.index("fill-prepared") < svg.index("fill-&lt;b&gt;")


def test_the_histogram_scales_bars_to_the_busiest_slice():
    buckets = [(T0, 0), (T0 + dt.timedelta(minutes=1), 5), (T0 + dt.timedelta(minutes=2), 10)]
    svg = str(charts.histogram(buckets, width=300, height=64))
    heights = [float(h) for h in re.findall(r'height="([0-9.]+)" class="fill-bar"', svg)]
    assert heights == [0.0, 19.0, 38.0]
    assert 'aria-label="15 events over time, busiest slice 10"' in svg
    assert ">10 events per 1 min<" in svg, "the scale, with its unit"
    assert ">2026-11-30 12:00<" in svg and ">2026-11-30 12:02 UTC<" in svg


def test_the_activity_strip_places_a_run_on_the_shared_axis():
    span = (T0, T0 + dt.timedelta(hours=10))
    svg = str(charts.activity_strip(T0 + dt.timedelta(hours=5), T0 + dt.timedelta(hours=10), span, width=100))
    assert '<rect x="50.00" y="0" width="50.00"' in svg
    assert "no events" in str(charts.activity_strip(None, None, span))


def test_each_colour_of_the_status_bar_has_its_own_marks_so_colour_is_not_the_only_cue():
    """Under deuteranopia or in greyscale the bar's green, amber and red are hard to tell apart:
    each colour the stylesheet gives a status also has marks of its own kind (and no two colours
    share a kind), drawn in every segment wide enough to hold one."""
    css = (Path(__file__).resolve().parent.parent / "static" / "css" / "site.css").read_text()
    colour_of = {}
    for selectors, colour in re.findall(r"((?:svg\.chart \.fill-[a-z-]+,?\s*)+)\{ fill: var\(--([a-z]+)\); \}", css):
        colour_of.update(dict.fromkeys(re.findall(r"\.fill-([a-z-]+)", selectors), colour))
    assert {charts.fill_class(s).removeprefix("fill-") for s in charts.STATUS_ORDER} <= set(colour_of), "a colour each"
    kinds_of_colour: dict[str, set[str]] = {}
    for status in charts.STATUS_ORDER:
        svg = str(charts.status_bar({status: 1}, width=60, height=12))
        drawn = re.findall(r'<path class="mark mark-([a-z]+)" d="([^"]+)"', svg)
        kind = drawn[0][0] if drawn else "plain"
        assert drawn or kind == charts.MARKS[status] == "plain", f"{status} has no marks"
        kinds_of_colour.setdefault(colour_of[charts.fill_class(status).removeprefix("fill-")], set()).add(kind)
    assert all(len(kinds) == 1 for kinds in kinds_of_colour.values()), kinds_of_colour
    kinds = [next(iter(k)) for k in kinds_of_colour.values()]
    assert len(set(kinds)) == len(kinds) >= 3, f"two colours share their marks: {kinds_of_colour}"
    other = str(charts.status_bar({"legacy": 1}, width=60))
    assert 'class="mark mark-dots"' in other, "a status the protocol does not list is dotted"


def test_the_marks_stay_inside_their_segment():
    svg = str(charts.status_bar({"committed": 1, "prepared": 1, "rejected": 1}, width=90, height=12))
    for (x, width), path in zip(
        re.findall(r'<rect x="([0-9.]+)" y="0" width="([0-9.]+)" height="12" class="fill-(?:prepared|rejected)"', svg),
        re.findall(r'class="mark mark-[a-z]+" d="([^"]+)"', svg),
        strict=True,
    ):
        xs = [float(v) for v in re.findall(r"[ML]([0-9.]+) ", path)]
        assert xs and float(x) <= min(xs) and max(xs) <= float(x) + float(width)
