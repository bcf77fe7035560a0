"""What each action of the audit is, in the reader's language (docs/glossary.md).

An action's code (``finding_snoozed``) is the record's word: downloads, the API and the admin
say it as it is, and pages show it as code beside these words. Every action an
``AuditEntry`` can hold has its words here (tests/test_finding_words.py says so).
"""

from __future__ import annotations

from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

from evidence.models import AuditEntry

ACTIONS: dict[str, Promise] = {
    AuditEntry.LEGAL_HOLD_SET: _("legal hold set"),
    AuditEntry.LEGAL_HOLD_LIFTED: _("legal hold lifted"),
    AuditEntry.BODIES_STRIPPED: _("bodies stripped"),
    AuditEntry.RUN_ARCHIVED: _("run archived"),
    AuditEntry.EVIDENCE_EXPORTED: _("evidence exported"),
    AuditEntry.ACKNOWLEDGED: _("finding acknowledged"),
    AuditEntry.UNACKNOWLEDGED: _("acknowledgement undone"),
    AuditEntry.SNOOZED: _("finding snoozed"),
    AuditEntry.UNSNOOZED: _("snooze undone"),
    AuditEntry.TRIAGE_ENDED: _("triage ended by an import"),
    AuditEntry.HOST_MOVED: _("run handed to another host"),
    AuditEntry.HOST_COPY_REMOVED: _("the host's own copy removed after the archive"),
    AuditEntry.PERSON_RENAMED: _("a person's account renamed"),
    AuditEntry.PERSON_REMOVED: _("a person's account removed"),
}


def action(code: object) -> str:
    """An action in the reader's words; "" for one nobody foresaw (its code says it)."""
    words = ACTIONS.get(code) if isinstance(code, str) else None
    return str(words) if words is not None else ""
