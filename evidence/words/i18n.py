"""How the dashboard says a time, an age and a protocol word in the reader's language.

The words a record holds (a status, a decision, a disposition) stay what they are in
downloads, the API and the evidence manifest; pages show them translated, the record's own
word in the badge's ``data-value``. docs/glossary.md fixes the Chinese for each.
"""

from __future__ import annotations

import datetime as dt
import functools

from django.utils import formats
from django.utils.functional import Promise
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import get_language, gettext, ngettext, pgettext_lazy

from receipts import protocol


def shown_time(moment: object) -> str:
    """A time for people, to the second in UTC, in the reader's language: ``2026-12-03
    06:49:32 UTC``, ``2026年12月3日 06:49:32 UTC``. A datetime or RFC 3339 text; anything else
    comes back as its text (what a record holds is data, quoted as it is)."""
    if isinstance(moment, str):
        try:
            parsed: object = protocol.parse_time(moment)
        except ValueError:
            return moment
    else:
        parsed = moment
    if not isinstance(parsed, dt.datetime):
        return str(parsed)
    return _shown_utc(parsed.astimezone(dt.UTC), get_language())


@functools.lru_cache(maxsize=4096)
def _shown_utc(instant: dt.datetime, language: str | None) -> str:
    """``shown_time`` of a UTC instant, remembered per language (``language``, the active one,
    keys the cache): Django's date format is the dearest part of a time cell, and a page says
    many instants twice (a row's time and the tooltip of its age)."""
    if instant.year < 1000:
        # Django's "Y" writes the year 1 as "1": the protocol's own form keeps four digits.
        return protocol.human_time(instant)
    return formats.date_format(instant.replace(tzinfo=None), "DATETIME_FORMAT") + " UTC"


def time_html(moment: dt.datetime) -> SafeString:
    """The one way a page shows a time: ``<time datetime="…Z" title="… UTC" data-local>`` with the
    UTC text (``shown_time``). static/js/dashboard.js rewrites the text in the reader's own time
    zone and keeps the UTC in the tooltip; without JavaScript the page says UTC."""
    utc = shown_time(moment)
    return format_html('<time datetime="{}" title="{}" data-local>{}</time>', protocol.format_time(moment), utc, utc)


def span(seconds: int) -> str:
    """A length of time in its largest two units: ``3 h 12 min``, ``3 小时 12 分钟``."""
    if seconds < 60:
        return ngettext("%(n)d s", "%(n)d s", seconds) % {"n": seconds}
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if days:
        return gettext("%(days)d d %(hours)d h") % {"days": days, "hours": hours % 24}
    if hours:
        return gettext("%(hours)d h %(minutes)d min") % {"hours": hours, "minutes": minutes % 60}
    return ngettext("%(n)d min", "%(n)d min", minutes) % {"n": minutes}


def age_text(since: dt.datetime, now: dt.datetime | None = None) -> str:
    """How long ago: ``3 h 12 min ago``. A time a little ahead of this clock (another host's)
    is "just now"; one further ahead is said as such ("in 20 min"), never as a past it is not."""
    seconds = int(((now or protocol.utc_now()) - since).total_seconds())
    if -60 < seconds < 1:
        return gettext("just now")
    if seconds < 0:
        return gettext("in %(span)s") % {"span": span(-seconds)}
    return gettext("%(span)s ago") % {"span": span(seconds)}


# What a badge says for each word of the protocol and of the dashboard's own states. A word
# not here (a ledger value nobody foresaw) is data, and shows as it is.
WORDS: dict[str, Promise] = {
    "committed": pgettext_lazy("status", "committed"),
    "prepared": pgettext_lazy("status", "prepared"),
    "rejected": pgettext_lazy("status", "rejected"),
    "unknown": pgettext_lazy("status", "unknown"),
    "failed": pgettext_lazy("status", "failed"),
    "missing": pgettext_lazy("status", "missing"),
    "reuse": pgettext_lazy("decision", "reuse"),
    "query": pgettext_lazy("decision", "query"),
    "confirm": pgettext_lazy("decision", "confirm"),
    "retry": pgettext_lazy("decision", "retry"),
    "stop": pgettext_lazy("decision", "stop"),
    "created": pgettext_lazy("disposition", "created"),
    "reused": pgettext_lazy("disposition", "reused"),
    "conflict": pgettext_lazy("disposition", "conflict"),
    "reserved": pgettext_lazy("phase", "reserved"),
    "task_created": pgettext_lazy("phase", "task_created"),
    "error": pgettext_lazy("severity", "error"),
    "warning": pgettext_lazy("severity", "warning"),
    "tampered": pgettext_lazy("verdict", "tampered"),
    "unverified": pgettext_lazy("verdict", "unverified"),
    "disputed": pgettext_lazy("verdict", "disputed"),
    "verified": pgettext_lazy("verdict", "verified"),
    "settled: committed": pgettext_lazy("status", "settled: committed"),
    "settled: rejected": pgettext_lazy("status", "settled: rejected"),
    "in doubt": pgettext_lazy("status", "in doubt"),
    "stale reservation": pgettext_lazy("status", "stale reservation"),
    "ok": pgettext_lazy("verdict", "ok"),
    "keep": pgettext_lazy("retention", "keep"),
    "strip_bodies": pgettext_lazy("retention", "strip_bodies"),
    "archive": pgettext_lazy("retention", "archive"),
    "archived": pgettext_lazy("retention", "archived"),
    "shipping": pgettext_lazy("host", "shipping"),
    "silent": pgettext_lazy("host", "silent"),
    "stopped": pgettext_lazy("host", "stopped"),
    "one-off": pgettext_lazy("host", "one-off"),
    "present": pgettext_lazy("target", "present"),
    "absent": pgettext_lazy("target", "absent"),
    "unclear": pgettext_lazy("target", "unclear"),
    "live": pgettext_lazy("run", "live"),
    "running": pgettext_lazy("run", "running"),
    "finished": pgettext_lazy("run", "finished"),
    "abandoned": pgettext_lazy("run", "abandoned"),
    "retrying": pgettext_lazy("run", "retrying"),
    "succeeded": pgettext_lazy("run", "succeeded"),
    "completed": pgettext_lazy("run", "completed"),
    "cancelled": pgettext_lazy("run", "cancelled"),
    "acknowledged": pgettext_lazy("triage", "acknowledged"),
    "snoozed": pgettext_lazy("triage", "snoozed"),
    "open": pgettext_lazy("triage", "open"),
}


# The roles (evidence/lib/roles.py), as a refusal names them.
ROLE_WORDS: dict[str, Promise] = {
    "viewer": pgettext_lazy("role", "viewer"),
    "confirmer": pgettext_lazy("role", "confirmer"),
    "exporter": pgettext_lazy("role", "exporter"),
    "admin": pgettext_lazy("role", "admin"),
}


def word(value: object) -> str:
    """The reader's word for a protocol value; an unforeseen value as it is."""
    text = value if isinstance(value, str) else str(value)
    return _words_in(get_language()).get(text, text)


@functools.lru_cache(maxsize=16)
def _words_in(language: str | None) -> dict[str, str]:
    """``WORDS`` said in ``language`` (the active one, which keys the cache): looked up once, not
    for every badge and cell of every page (a page of fifty rows said the same words hundreds of
    times)."""
    return {text: str(label) for text, label in WORDS.items()}


def table_language() -> str:
    """The reader's language as the standard-library tables (``receipts.states``) name it."""
    return "zh-Hans" if (get_language() or "").lower().startswith("zh") else "en"
