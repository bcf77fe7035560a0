"""Every finding code the reader can emit has a title, shown beside the code (evidence/words/finding_titles.py)."""

from __future__ import annotations

from django.utils import translation

from evidence.templatetags.findings import finding_title
from evidence.words import finding_titles
from receipts.findings import CODES


def test_every_code_the_reader_can_emit_has_a_title_and_no_other_code_does():
    assert set(finding_titles.TITLES) == set(CODES)
    assert all(str(title).strip() for title in finding_titles.TITLES.values())


def test_a_title_is_in_the_readers_language_and_an_unforeseen_code_has_none():
    with translation.override("en"):
        assert finding_title("stale_call") == "Stale call"
    with translation.override("zh-hans"):
        assert finding_title("stale_call") not in ("", "Stale call")
    assert finding_title("no_such_code") == ""
    assert finding_title(None) == ""
