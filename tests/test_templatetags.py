"""The dashboard's template tags: any JSON value shown as text, ages, short digests, links."""

from __future__ import annotations

import datetime as dt

from evidence.templatetags import dashboard
from receipts import protocol


def test_a_badge_names_its_value_and_never_colours_alone():
    # the shown word in the reader's language, the record's own in data-value
    assert str(dashboard.badge("reuse")) == '<span data-value="reuse" class="badge badge-ok">reuse</span>'
    assert str(dashboard.badge("")) == '<span data-value="missing" class="badge badge-neutral">missing</span>'
    # a state wears its own glyph (hidden from screen readers, which read its word) and names itself
    assert str(dashboard.badge("committed")) == (
        '<span data-value="committed" data-state="committed" class="badge badge-ok state">'
        '<span class="glyph" aria-hidden="true">\u2713</span>committed</span>'
    )
    assert 'class="badge badge-neutral state"' in str(dashboard.badge("committed", unproven=True))


def test_a_badge_takes_any_json_value_and_escapes_it():
    # a value nobody foresaw is data: no translator touches it
    assert str(dashboard.badge(["x"])) == '<span class="badge badge-neutral" translate="no">[&quot;x&quot;]</span>'
    assert "&lt;script&gt;" in str(dashboard.badge("<script>"))


def test_short_cuts_text_and_json_alike():
    assert dashboard.short("a" * 64) == "a" * 12
    assert dashboard.short({"k": 1}, 4) == '{"k"'
    assert dashboard.short(None) == ""


def test_short_subject_cuts_every_digest_in_a_subject():
    subject = "receipts/" + "a" * 64 + ".json"
    assert dashboard.short_subject(subject) == "receipts/" + "a" * 12 + "….json"


def test_age_in_the_two_largest_units(monkeypatch):
    monkeypatch.setenv("RECEIPTS_CLOCK", "2026-11-30T12:00:00Z")
    now = protocol.utc_now()
    assert ">30 s ago</time>" in dashboard.age(now - dt.timedelta(seconds=30))
    assert ">3 h 12 min ago</time>" in dashboard.age(now - dt.timedelta(hours=3, minutes=12))
    assert ">2 d 5 h ago</time>" in dashboard.age(now - dt.timedelta(days=2, hours=5))
    assert dashboard.age(None) == "unknown"


def test_url_of_encodes_a_submission_id():
    assert dashboard.url_of("submission", "run-1", "a&b #c") == "/runs/run-1/?submission=a%26b+%23c#submissions"
    assert dashboard.url_of("call", "run-1", "ab" * 32) == f"/runs/run-1/calls/{'ab' * 32}/"
    assert dashboard.url_of("run", "run-1") == "/runs/run-1/"


def test_when_is_one_format_in_utc_for_datetimes_and_rfc3339_text():
    moment = dt.datetime(2026, 11, 30, 13, 4, 5, 123456, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    shown = str(dashboard.when(moment))
    exact = "2026-11-30T12:04:05.123456Z"
    utc = "2026-11-30 12:04:05 UTC"
    assert shown == f'<time datetime="{exact}" title="{utc}" data-local>{utc}</time>'
    assert str(dashboard.when("2026-11-30T12:04:05.123456Z")) == shown
    assert dashboard.when(None) == "—" and dashboard.when("not a time") == "not a time"


def test_a_badge_shows_the_readers_word_and_keeps_the_records_own():
    from django.utils import translation

    with translation.override("zh-hans"):
        shown = str(dashboard.badge("settled: committed"))
        assert shown == (
            '<span data-value="settled: committed" data-state="settled: committed" class="badge badge-info state">'
            '<span class="glyph" aria-hidden="true">\u2611</span>已裁定：已提交</span>'
        )
        assert dashboard.state_to_do("in doubt").startswith("需要您处理")
        assert str(dashboard.badge("reuse")) == '<span data-value="reuse" class="badge badge-ok">复用</span>'
        assert str(dashboard.badge("a word nobody foresaw")) == (
            '<span class="badge badge-neutral" translate="no">a word nobody foresaw</span>'
        )
