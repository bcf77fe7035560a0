"""The SVG charts: shapes in proportion, labels escaped, a text alternative on each."""

from __future__ import annotations

import datetime as dt
import re

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
