"""Template tags of the dashboard: charts, badges, ages."""

from __future__ import annotations

import datetime as dt
import json
import re

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import pgettext

from evidence.lib import people
from evidence.review import inbox
from evidence.web import charts
from evidence.web.views.common import url_of
from evidence.words import audit_words, decision_text, i18n
from receipts import protocol, states

register = template.Library()

register.simple_tag(charts.status_bar, name="status_bar")
register.simple_tag(url_of, name="url_of")
register.simple_tag(charts.histogram, name="histogram")
register.simple_tag(charts.activity_strip, name="activity_strip")
register.simple_tag(charts.state_legend, name="state_legend")
register.filter("kind_label", inbox.kind_label)  # an inbox kind as a page says it

# The kind of each word's badge, shared with the evidence page the verifier renders.
BADGE_CLASSES = states.KINDS


@register.filter
def audit_action(code: object) -> str:
    """``{{ entry.action|audit_action }}``: the action in the reader's words ("" for an unforeseen one)."""
    return audit_words.action(code)


@register.filter
def audit_reason(entry: object) -> SafeString:
    """``{{ entry|audit_reason }}``: its reason, what the system added to it in the reader's words."""
    return audit_words.reason(entry)


@register.filter
def lookup(mapping: object, key: str) -> object:
    return mapping.get(key, "") if isinstance(mapping, dict) else ""


@register.filter
def as_text(value: object) -> str:
    """Any value a ledger line may hold, as text: a string as it is, anything else as compact JSON."""
    return value if isinstance(value, str) else as_json(value)


@register.simple_tag
def badge(value: object, unproven: bool = False) -> SafeString:
    """A status, decision, disposition or severity as a labelled badge (text, not colour alone).

    A state of ``receipts.states.STATES`` is drawn from that table alone (``state_badge``).
    Event payloads are whatever the ledger holds: a list or an object is shown as JSON, never a 500.
    ``unproven``: said of a call whose receipt fails its identity check, never green.
    """
    label = as_text(value) if value not in (None, "") else "missing"
    if label in states.STATES:
        return state_badge(label, unproven=unproven)
    kind = BADGE_CLASSES.get(label, "neutral")
    shown = i18n.word(label)
    if shown == label and label not in i18n.WORDS:
        # a value nobody foresaw is data: no translator may touch it
        return format_html(
            '<span class="badge badge-{}" translate="no">{}</span>',
            "neutral" if unproven and kind == "ok" else kind,
            label,
        )
    # The record's own word first, so that a page reads '<... badge-ok">committed' in English
    # and a program finds the word in data-value whatever the language.
    return format_html(
        '<span data-value="{}" class="badge badge-{}">{}</span>',
        label,
        "neutral" if unproven and kind == "ok" else kind,
        shown,
    )


def state_badge(name: str, unproven: bool = False) -> SafeString:
    """A state as every page shows it: its tone, its own glyph (hidden from screen readers, which
    read the word), its word in the reader's language; ``data-state`` names it for programs and
    for the test that no page shows a state outside the table."""
    state = states.STATES[name]
    tone = "neutral" if unproven and state.tone == "ok" else state.tone
    return format_html(
        '<span data-value="{}" data-state="{}" class="badge badge-{} state">'
        '<span class="glyph" aria-hidden="true">{}</span>{}</span>',
        name,
        name,
        tone,
        state.glyph,
        state.word(i18n.table_language()),
    )


@register.simple_tag
def state_to_do(name: str) -> str:
    """What a person does about a state, in the reader's language ("" for a word not a state)."""
    state = states.STATES.get(name)
    return state.to_do(i18n.table_language()) if state else ""


@register.simple_tag
def call_status(call: object, settled_by: str = "", settled_on_host: str = "") -> SafeString:
    """A call's status as pages show it (``Call.shown_status``); a settled call says what its
    receipt says, what a person settled it as, and who: "prepared → settled: committed by carol".
    Settled by a file no decision made on the dashboard matches (``settled_on_host``), it says where,
    and that the name is the file's, not an account: "... on host web-1 by ops (the name its file
    gives, not a dashboard account)"."""
    shown = getattr(call, "shown_status", "")
    if not getattr(call, "settled", False):
        return badge(shown)
    by = settled_by or getattr(call, "settled_by", "")
    on_host = settled_on_host or getattr(call, "settled_on_host", "")
    name = format_html('<span translate="no">{}</span>', by)
    said: SafeString | str = ""
    if on_host:
        said = format_html(
            _("on host {host} by {name} (the name its file gives, not a dashboard account)"),
            host=format_html('<code translate="no">{}</code>', on_host),
            name=name,
        )
    elif by:
        said = format_html(_("by {}"), name)
    return format_html(
        '<span class="muted">{} →</span> {}{}',
        i18n.word(getattr(call, "status", "")),
        badge(shown),
        format_html(' <span class="muted">{}</span>', said) if said else "",
    )


@register.simple_tag
def person(row: object) -> SafeString:
    """Who a record says acted (``people.who``): the name they had then, their id, and what became
    of the account, so that two people who had the same name are never read as one."""
    found = people.who(row)
    shown = format_html('<span translate="no">{}</span>', found.name)
    if found.person_id is None:
        return shown
    shown = format_html('{} <span class="muted person-id">#{}</span>', shown, found.person_id)
    if found.removed:
        return format_html('{} <span class="muted">{}</span>', shown, _("(account removed)"))
    if found.renamed_to:
        now_named = format_html('<span translate="no">{}</span>', found.renamed_to)
        renamed = format_html(_("(renamed since to {})"), now_named)
        return format_html('{} <span class="muted">{}</span>', shown, renamed)
    return shown


@register.simple_tag
def call_decision(call: object) -> SafeString:
    """A call's recovery decision as a badge: never green for a receipt that fails its check."""
    verification = getattr(call, "verification", "")
    return badge(getattr(call, "decision", ""), unproven=verification in protocol.SHOWN_FOR_VERDICT)


@register.filter
def when(moment: object) -> str:
    """One time format on every page (``i18n.time_html``): the reader's language and time zone,
    UTC in the tooltip, the exact instant, RFC 3339, in the element's datetime.

    Takes a datetime, or an RFC 3339 string as records hold them.
    """
    if isinstance(moment, str):
        text = moment
        try:
            moment = protocol.parse_time(text)
        except ValueError:
            return text
    if not isinstance(moment, dt.datetime):
        return "—"
    return i18n.time_html(moment)


@register.filter
def age(since: dt.datetime | None) -> str:
    """How long ago, in the largest two units (``3 h 12 min ago``), the time itself in a tooltip."""
    if since is None:
        return pgettext("age", "unknown")
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        protocol.format_time(since),
        i18n.shown_time(since),
        i18n.age_text(since),
    )


register.simple_tag(decision_text.resume_command, name="resume_command")


@register.filter
def decision_reason(reason: str) -> SafeString:
    """A recovery decision's reason in the reader's language (evidence.words.decision_text)."""
    return decision_text.reason_shown(reason)


@register.filter
def word(value: object) -> str:
    """A protocol word (a status, a decision, a phase) in the reader's language, outside a badge."""
    return i18n.word(value)


@register.filter
def short(value: object, length: int = 12) -> str:
    return as_text(value)[:length] if value else ""


HEX64 = re.compile(r"[0-9a-f]{64}")


@register.filter
def short_subject(subject: str) -> str:
    """A finding's subject with any 64-hex digest cut to 12 characters (the full one is in a tooltip)."""
    return HEX64.sub(lambda match: match.group(0)[:12] + "…", subject)


@register.filter
def as_json(value: object) -> str:
    """Compact JSON, as the ledger holds it (escaped by the template like any text)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)
