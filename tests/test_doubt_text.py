"""The doubt panel's sentences in the reader's language, word for word receipts.doubt's in English."""

from __future__ import annotations

import html

from django.utils import translation
from django.utils.html import strip_tags

from evidence.words import doubt_text
from receipts import doubt

MESSAGE = {"to": "ops@example.com", "body": "deployed"}


def test_in_english_the_panel_says_what_receipts_doubt_says():
    with translation.override("en"):
        for tool, args in [("send_message", MESSAGE), ("write_file", {"path": "a.py", "content": "x"}),
                           ("ticket", {"title": "x"})]:  # fmt: skip
            assert html.unescape(strip_tags(doubt_text.description(tool, args))) == doubt.describe(tool, args)
        evidence = doubt.Evidence(doubt.PRESENT, ("line 1",))
        shown = doubt_text.reading("send_message", evidence)
        said = doubt.reading("send_message", evidence)
        assert said is not None and shown == doubt.Reading("committed", said.sentence)


def test_in_chinese_the_sentence_is_translated_and_the_values_are_data():
    with translation.override("zh-hans"):
        said = doubt_text.description("send_message", MESSAGE)
        reading = doubt_text.reading("write_file", doubt.Evidence(doubt.ABSENT, ()), queried=True)
    assert said.startswith("发送消息给") and '<span translate="no">deployed</span>' in said
    assert reading is not None and reading.resolution == "rejected" and "恢复运行" in reading.sentence


def test_an_adapters_own_words_and_every_fact_are_data():
    with translation.override("zh-hans"):
        assert doubt_text.facts(doubt.Evidence(doubt.UNCLEAR, ("a <b>", "two"))) == (
            '<span translate="no">a &lt;b&gt;</span>',
            '<span translate="no">two</span>',
        )
