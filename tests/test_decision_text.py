"""A recovery decision's reason on a page (evidence.words.decision_text): in English the sentence
receipts.recovery wrote, in Chinese a translation with the record's values kept; a reason no
pattern knows is data."""

from __future__ import annotations

import html
import itertools

import pytest
from django.utils import translation
from django.utils.html import strip_tags

from evidence.words import decision_text
from receipts import protocol, recovery
from tests.i18n_check import english_on

STATUSES = [None, "committed", "prepared", "unknown", "rejected", "failed", "half-done"]
ERROR_KINDS = [None, "retryable", "permanent", "flaky"]
CONFIRMATIONS = [None, "committed", "rejected"]
VERDICTS = [protocol.VERIFIED, protocol.MISMATCH, protocol.UNVERIFIABLE, protocol.DISPUTED]


def every_reason() -> set[str]:
    """Every sentence recovery.decide writes, over every kind of fact it reads."""
    return {
        recovery.decide(status=status, error_kind=kind, queryable=queryable, confirmation=confirmation,
                        verification=verdict).reason
        for status, kind, queryable, confirmation, verdict in itertools.product(
            STATUSES, ERROR_KINDS, [False, True], CONFIRMATIONS, VERDICTS)
    }  # fmt: skip


def test_every_reason_recovery_writes_has_a_sentence():
    reasons = every_reason()
    assert len(reasons) >= len(decision_text.SENTENCES)
    for reason in reasons:
        assert 'translate="no"' not in decision_text.reason_shown(reason), reason


def test_in_english_the_page_says_what_recovery_wrote():
    with translation.override("en"):
        for reason in every_reason():
            assert html.unescape(strip_tags(decision_text.reason_shown(reason))) == reason


def test_in_chinese_no_english_is_left_and_values_stay_as_written():
    with translation.override("zh-hans"):
        for reason in every_reason():
            assert english_on(decision_text.reason_shown(reason)) == [], reason
        odd = decision_text.reason_shown(recovery.decide(status="rejected", error_kind="flaky").reason)
        legacy = decision_text.reason_shown(recovery.decide(status="failed").reason)
        confirmed = decision_text.reason_shown(recovery.decide(status="prepared", confirmation="committed").reason)
    assert "<code>&#x27;flaky&#x27;</code>" in odd and "<code>&#x27;failed&#x27;</code>" in legacy
    assert confirmed.startswith("已准备")


@pytest.mark.parametrize("reason", ["an older writer said this", "<b>committed</b>: reuse"])
def test_a_reason_no_pattern_knows_is_data(reason):
    with translation.override("zh-hans"):
        shown = decision_text.reason_shown(reason)
    assert shown == f'<span translate="no">{html.escape(reason, quote=True)}</span>'
