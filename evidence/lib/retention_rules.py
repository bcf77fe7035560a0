"""What keeps a run whatever its age, and when its retention clock starts: the rules retention's
plans follow, kept with each run's summary (evidence/lib/stats.py) so that a page of plans reads one
page of runs.

A reason is a ``Why``: its English for downloads, the command line and the audit, and the same
sentence in the reader's language for the page (docs/glossary.md).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import types
from typing import Any, Protocol

from django.utils.functional import Promise
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext, gettext_lazy, ngettext_lazy, override

from evidence.words import i18n
from receipts import protocol
from receipts.findings import DIGEST_CODES


class Summary(Protocol):
    """What the rules read of a run's summary (``stats.RunSummary``, which keeps their verdict)."""

    in_doubt: int
    findings_by_code: dict[str, int]
    last_decision_at: dt.datetime | None


class Code(str):
    """A value of a "why" shown as code (a finding code, a state the ledger holds)."""


@dataclasses.dataclass(frozen=True)
class Why:
    """One sentence of a plan: ``str()`` is its English (what downloads, the command line and
    the audit keep), ``shown()`` the same sentence in the reader's language for the page, its
    values kept as data (``translate="no"``, a code in ``<code>``, a time as ``when`` shows it)."""

    message: Promise  # gettext_lazy / ngettext_lazy, with %(name)s for each value
    values: tuple[tuple[str, object], ...] = ()

    def __str__(self) -> str:
        with override("en"):
            return str(self.message % {name: _english(value) for name, value in self.values})

    def shown(self) -> SafeString:
        # The catalogue's sentence is trusted as a template's is; every value is escaped.
        return mark_safe(str(self.message % {name: _shown(value) for name, value in self.values}))  # noqa: S308


def _english(value: object) -> object:
    if isinstance(value, dt.datetime):
        return protocol.human_time(value)
    if isinstance(value, Why | Joined):
        return str(value)
    if isinstance(value, tuple):
        return ", ".join(str(_english(item)) for item in value)
    return value


def _shown(value: object) -> object:
    if isinstance(value, dt.datetime):
        return i18n.time_html(value)
    if isinstance(value, Why | Joined):
        return value.shown()
    if isinstance(value, tuple):  # codes, in a list as the reader's language writes one
        return format_html_join(gettext(", "), "{}", ((_shown(item),) for item in value))
    if isinstance(value, Code):
        return format_html("<code>{}</code>", value)
    if isinstance(value, int):
        return value
    return format_html('<span translate="no">{}</span>', value)


def why(message: Promise, **values: object) -> Why:
    return Why(message, tuple(values.items()))


def retention_facts(run: Any, summary: Summary) -> dict[str, Any]:
    """What the plan's filters read, kept with the summary: whether anything keeps the run
    whatever its age, and when its clock started. ``run``: its state and legal hold (a mapping)."""
    run = types.SimpleNamespace(**run) if isinstance(run, dict) else run
    return {"retention_blocked": bool(blockers(run, summary)), "retention_clock_from": clock_from(run, summary)}


def clock_from(run: Any, summary: Summary) -> dt.datetime | None:
    """When the run's clock started: its last event on the server's clock (``activity_at``; the
    host's time for a run imported before it was kept), a person's later decision or hold."""
    last_event = getattr(run, "activity_at", None) or run.last_event_at
    moments = (last_event, summary.last_decision_at, run.legal_hold_since)
    return max(filter(None, moments), default=None)


def blockers(run: Any, summary: Summary) -> list[Why]:
    """What keeps the run whatever its age (``str()`` of each: its English)."""
    blockers = []
    if run.legal_hold:
        message = gettext_lazy("a legal hold (%(by)s: %(reason)s)")
        blockers.append(why(message, by=run.legal_hold_by, reason=run.legal_hold_reason))
    if not protocol.run_is_finished(run.state):
        if run.state:
            blockers.append(why(gettext_lazy("unfinished (state %(state)s)"), state=Code(run.state)))
        else:
            blockers.append(why(gettext_lazy("unfinished (state none)")))
    in_doubt, codes = summary.in_doubt, summary.findings_by_code
    if in_doubt:
        message = ngettext_lazy(
            "%(count)s call in doubt, not yet settled", "%(count)s calls in doubt, not yet settled", "count"
        )
        blockers.append(why(message, count=in_doubt))
    if codes.get("stale_reservation"):
        blockers.append(why(gettext_lazy("a stale reservation")))
    if codes.get("submission_conflict"):
        blockers.append(why(gettext_lazy("an open submission conflict")))
    mismatches = tuple(Code(code) for code in sorted(codes) if code in DIGEST_CODES)
    if mismatches:
        blockers.append(why(gettext_lazy("open %(codes)s"), codes=mismatches))
    return blockers


class Joined:
    """Blockers one after the other, as the reason of a run they keep."""

    def __init__(self, parts: list[Why]) -> None:
        self.parts = parts

    def __str__(self) -> str:
        return "; ".join(str(part) for part in self.parts)

    def shown(self) -> SafeString:
        return format_html_join(gettext("; "), "{}", ((part.shown(),) for part in self.parts))
