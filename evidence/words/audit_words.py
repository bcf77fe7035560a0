"""What each action of the audit is, and what the system added to its reason, in the
reader's language (docs/glossary.md).

An action's code (``finding_snoozed``) is the record's word: downloads, the API and the admin
say it as it is, and pages show it as code beside these words. Every action an
``AuditEntry`` can hold has its words here (tests/test_finding_words.py says so).

A reason is what a person typed (data), except the words triage adds in English
(``evidence.review.triage``): how long a snooze lasts, and why an import ended a triage. Each of
those is here as a pattern and a msgid; a reason no pattern knows is shown as written.
"""

from __future__ import annotations

import re

from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext, gettext_noop

from evidence.models import AuditEntry
from evidence.words import i18n
from evidence.words.finding_words import data

_ = gettext_noop

ACTIONS: dict[str, str] = {
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
    AuditEntry.CLAIMED: _("a person said they are on an inbox item"),
    AuditEntry.CLAIM_RELEASED: _("a person is no longer on an inbox item"),
    AuditEntry.CLAIM_EXPIRED: _("a claim on an inbox item ran out"),
    AuditEntry.DECISION_MADE_ON_HOST: _("a call settled on its host, not on the dashboard"),
    AuditEntry.DECISION_WITHDRAWN: _("a decision withdrawn before it was written into the run"),
}


def action(code: object) -> str:
    """An action in the reader's words; "" for one nobody foresaw (its code says it)."""
    words = ACTIONS.get(code) if isinstance(code, str) else None
    return gettext(words) if words is not None else ""


# What evidence.review.triage writes after a person's reason, or as the import's: (action, the
# pattern of the whole reason, the page's msgid with the same names).
REASONS: list[tuple[str, re.Pattern[str], str]] = [
    (action_code, re.compile(pattern, re.DOTALL), msgid)
    for action_code, pattern, msgid in [
        (
            AuditEntry.SNOOZED,
            r"(?P<reason>.*) \(snoozed until (?P<until>\S+) or until it changes\)",
            _("{reason} (snoozed until {until} or until it changes)"),
        ),
        (AuditEntry.SNOOZED, r"(?P<reason>.*) \(snoozed until it changes\)", _("{reason} (snoozed until it changes)")),
        (AuditEntry.SNOOZED, r"(?P<reason>.*) \(snoozed until (?P<until>\S+)\)", _("{reason} (snoozed until {until})")),
        (
            AuditEntry.TRIAGE_ENDED,
            r"(?P<triage>acknowledged|snoozed) no longer: it had closed, and opened again",
            _("{triage} no longer: it had closed, and opened again"),
        ),
        (
            AuditEntry.TRIAGE_ENDED,
            r"(?P<triage>acknowledged|snoozed) no longer: it changed \((?P<fields>[^)]*)\): (?P<detail>.*)",
            _("{triage} no longer: it changed ({fields}): {detail}"),
        ),
        (
            AuditEntry.DECISION_MADE_ON_HOST,
            r"(?P<resolution>committed|rejected) on host (?P<host>.*?) by the name (?P<name>.*), not a dashboard "
            r"account: no decision made on the dashboard matches confirmation (?P<confirmation>[0-9a-f]*)",
            _(
                "{resolution} on host {host} by the name {name}, not a dashboard account: no decision made on the "
                "dashboard matches confirmation {confirmation}"
            ),
        ),
        (
            AuditEntry.DECISION_WITHDRAWN,
            r"(?P<resolution>committed|rejected), decided by (?P<actor>.*?) at (?P<time>\S+): (?P<reason>.*)",
            _("{resolution}, decided by {actor} at {time}: {reason}"),
        ),
    ]
]


def reason(entry: object) -> SafeString:
    """An audit entry's reason: the person's words as data, what triage added to them in the
    reader's language (a time as the reader reads times, a triage state in their word)."""
    code, text = getattr(entry, "action", ""), str(getattr(entry, "reason", ""))
    for action_code, pattern, msgid in REASONS:
        found = pattern.fullmatch(text) if action_code == code else None
        if found is None:
            continue
        values = found.groupdict()
        shown = {name: data(value) for name, value in values.items() if name in ("reason", "detail")}
        if "until" in values:
            shown["until"] = format_html("{}", i18n.shown_time(values["until"]))
        if "triage" in values:
            shown["triage"] = format_html("{}", i18n.word(values["triage"]))
        if "fields" in values:
            shown["fields"] = format_html("<code>{}</code>", values["fields"])
        if "resolution" in values:
            shown["resolution"] = format_html("{}", i18n.word(values["resolution"]))
        if "time" in values:  # a decision withdrawn: who made it, when
            shown["actor"] = data(values["actor"])
            shown["time"] = format_html("{}", i18n.shown_time(values["time"]))
        if "host" in values:  # a decision made on a host: where, by what name, which file
            shown["host"] = format_html('<code translate="no">{}</code>', values["host"])
            shown["name"] = data(values["name"])
            shown["confirmation"] = format_html('<code class="digest">{}</code>', values["confirmation"][:16])
        return format_html(gettext(msgid), **shown)
    return data(text)
