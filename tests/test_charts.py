"""The SVG charts: shapes in proportion, labels escaped, a text alternative on each."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from django.utils import translation

from evidence.web import charts
from receipts import states

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def widths(svg: str) -> list[float]:
    return [float(width) for width in re.findall(r'<rect x="[^"]*" y="0" width="([^"]*)"', svg)]


def test_the_status_bar_stacks_statuses_in_the_protocols_order_and_in_proportion():
    svg = str(charts.status_bar({"rejected": 1, "committed": 3}, width=100))
    assert 'aria-label="calls: 3 committed, 1 rejected"' in svg
    assert widths(svg) == [75.0, 25.0]
    assert svg.index("fill-committed") < svg.index("fill-rejected")


def test_a_status_bar_drawn_again_is_said_in_the_language_of_its_page():
    """Bars are remembered once drawn (a page of runs draws the same few): never across languages."""
    counts = {"committed": 2, "prepared": 1}
    with translation.override("en"):
        english = str(charts.status_bar(counts))
    with translation.override("zh-hans"):
        chinese = str(charts.status_bar(dict(reversed(counts.items()))))
    with translation.override("en"):
        again = str(charts.status_bar(counts))
    assert 'aria-label="calls: 2 committed, 1 prepared"' in english and again == english
    assert chinese != english and "calls:" not in chinese
    assert "已提交" in chinese, chinese


def test_the_status_bar_of_no_call_says_so():
    assert "no calls" in str(charts.status_bar({}))


def test_an_unknown_status_goes_last_and_is_escaped():
    svg = str(charts.status_bar({"<b>odd</b>": 1, "in doubt": 1}, width=100))
    assert "<b>" not in svg and "&lt;b&gt;odd&lt;/b&gt;" in svg
    assert svg.index("fill-in-doubt") < svg.index("fill-&lt;b&gt;")


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


def test_each_state_has_its_own_marks_and_glyph_so_colour_is_not_the_only_cue():
    """Under deuteranopia or in greyscale the bar's green, amber and red are hard to tell apart,
    and a glyph that means "bad" says nothing of what happened (issue 37): each state of the table
    has marks and a glyph no other state has, its segment wears its tone's colour, and the
    stylesheet gives every tone one."""
    css = (Path(__file__).resolve().parent.parent / "static" / "css" / "site.css").read_text()
    tones = dict(re.findall(r"svg\.chart \.tone-([a-z]+) \{ fill: var\(--([a-z]+)\); \}", css))
    assert {state.tone for state in states.STATES.values()} <= set(tones), "a colour each"
    assert len({state.marks for state in states.STATES.values()}) == len(states.STATES), "two states share marks"
    assert len({state.glyph for state in states.STATES.values()}) == len(states.STATES), "two states share a glyph"
    for name, state in states.STATES.items():
        svg = str(charts.status_bar({name: 1}, width=60, height=12))
        assert f'class="{charts.fill_class(name)} tone-{state.tone}"' in svg
        drawn = re.findall(r'<path class="mark mark-([a-z]+)" d="([^"]+)"', svg)
        assert [kind for kind, _ in drawn] == ([] if state.marks == "plain" else [state.marks]), name
    other = str(charts.status_bar({"legacy": 1}, width=60))
    assert 'class="mark mark-dots"' in other and "tone-neutral" in other, "a word not in the table is dotted"


def test_the_legend_draws_each_call_state_as_the_bar_does():
    legend = str(charts.state_legend())
    for name in charts.CALL_STATES:
        bar = str(charts.status_bar({name: 1}, width=14, height=12))
        path = re.search(r'<path class="mark[^>]*></path>', bar)
        assert path is None or path.group(0) in legend, name


def test_the_marks_stay_inside_their_segment():
    svg = str(charts.status_bar({"committed": 1, "in doubt": 1, "rejected": 1}, width=90, height=12))
    for (x, width), path in zip(
        re.findall(
            r'<rect x="([0-9.]+)" y="0" width="([0-9.]+)" height="12" class="fill-(?:in-doubt|rejected) tone-[a-z]+"',
            svg,
        ),
        re.findall(r'class="mark mark-[a-z]+" d="([^"]+)"', svg),
        strict=True,
    ):
        xs = [float(v) for v in re.findall(r"[ML]([0-9.]+) ", path)]
        assert xs and float(x) <= min(xs) and max(xs) <= float(x) + float(width)
