"""A finding code's title, in the reader's language, beside the code (evidence/finding_titles.py)."""

from __future__ import annotations

from django import template

from evidence import finding_titles

register = template.Library()


@register.filter
def finding_title(code: object) -> str:
    """``{{ finding.code|finding_title }}``: the title, "" for a code nobody foresaw."""
    return finding_titles.title(code)
