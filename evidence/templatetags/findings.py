"""A finding code's title beside the code (evidence/words/finding_titles.py), and its detail
(evidence/words/finding_words.py), in the reader's language."""

from __future__ import annotations

from django import template
from django.utils.safestring import SafeString

from evidence.words import finding_titles, finding_words

register = template.Library()


@register.filter
def finding_title(code: object) -> str:
    """``{{ finding.code|finding_title }}``: the title, "" for a code nobody foresaw."""
    return finding_titles.title(code)


@register.filter
def finding_detail(finding: object) -> SafeString:
    """``{{ finding|finding_detail }}``: its detail in the reader's language, the values it
    quotes as data; a detail stored without its sentence, as data."""
    return finding_words.detail(
        getattr(finding, "sentence", ""), getattr(finding, "detail_values", None), getattr(finding, "detail", "")
    )


@register.filter
def identity_summary(identity: object) -> SafeString:
    """``{{ identity|identity_summary }}``: what its identity check found, in the reader's language."""
    return finding_words.identity_problems(identity)
