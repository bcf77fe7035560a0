"""A recovery decision's reason as a page says it, in the reader's language.

``receipts.recovery.decide`` writes each reason in English (the writer is standard library
only, and its reasons go to programs: downloads, the API, the ledger). Each sentence it can
write is here as a pattern and a msgid; the values inside (a status, an error kind) keep the
record's own words. A reason no pattern knows (an older writer's) is shown as data.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from django.utils.functional import Promise
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy

from evidence.words import i18n
from receipts import protocol
from receipts.builtin_tools import BUILTIN_ADAPTERS

_STATUS = r"(?P<status>[^,:]+)"
_QUOTED = r"(?P<{}>'[^']*'|\"[^\"]*\"|None)"

# (the sentence recovery.decide writes, as a pattern; the page's msgid, with the same names)
SENTENCES: list[tuple[re.Pattern[str], Promise]] = [
    (re.compile(pattern), said)
    for pattern, said in [
        (
            _STATUS + r", confirmed committed by a person: reuse, never execute again",
            gettext_lazy("{status}, confirmed committed by a person: reuse, never execute again"),
        ),
        (
            _STATUS + r", confirmed not done by a person: retry under the next attempt",
            gettext_lazy("{status}, confirmed not done by a person: retry under the next attempt"),
        ),
        (
            r"the receipt does not pass its identity check \(altered\?\): a person must decide",
            gettext_lazy("the receipt does not pass its identity check (altered?): a person must decide"),
        ),
        (
            r"committed, but its target did not show the result: the writer refused to reuse it",
            gettext_lazy("committed, but its target did not show the result: the writer refused to reuse it"),
        ),
        (
            r"the receipt's identity cannot be checked \(an input is missing\): a person decides",
            gettext_lazy("the receipt's identity cannot be checked (an input is missing): a person decides"),
        ),
        (
            r"committed: its result is reused, never executed again",
            gettext_lazy("committed: its result is reused, never executed again"),
        ),
        (
            _STATUS + r": the adapter asks the target whether the effect happened",
            gettext_lazy("{status}: the adapter asks the target whether the effect happened"),
        ),
        (
            _STATUS + r" and not queryable: a person must decide whether it happened",
            gettext_lazy("{status} and not queryable: a person must decide whether it happened"),
        ),
        (
            r"rejected with a retryable error: retry under the next attempt",
            gettext_lazy("rejected with a retryable error: retry under the next attempt"),
        ),
        (
            r"rejected permanently: retrying cannot help",
            gettext_lazy("rejected permanently: retrying cannot help"),
        ),
        (
            r"rejected with error kind " + _QUOTED.format("kind") + r": not known to be retryable",
            gettext_lazy("rejected with error kind {kind}: not known to be retryable"),
        ),
        (
            r"legacy status (?P<legacy>'failed') cannot tell retryable from permanent: a person decides",
            gettext_lazy("legacy status {legacy} cannot tell retryable from permanent: a person decides"),
        ),
        (
            r"the ledger names this call but its receipt is missing: a person decides",
            gettext_lazy("the ledger names this call but its receipt is missing: a person decides"),
        ),
        (
            r"status " + _QUOTED.format("value") + r" is not a receipt state: a person decides",
            gettext_lazy("status {value} is not a receipt state: a person decides"),
        ),
    ]
]


def _value(name: str, text: str) -> SafeString:
    if name == "status" and text in i18n.WORDS:
        return format_html("{}", i18n.word(text))
    # a quoted value, an error kind nobody foresaw: the record's own text
    return format_html("<code>{}</code>", text)


def reason_shown(reason: str) -> SafeString:
    """``reason`` in the reader's language; one no pattern knows, as data."""
    for pattern, said in SENTENCES:
        if match := pattern.fullmatch(reason):
            values = {name: _value(name, text) for name, text in match.groupdict().items()}
            return format_html(str(said), **values) if values else format_html("{}", said)
    return format_html('<span translate="no">{}</span>', reason)


# A command longer than this is not one to copy from a page: the page then says ARGS.
RESUME_ARGS_MAX = 2000


def resume_command(call: Any) -> str | None:
    """The command that makes a built-in tool's call again, as a resuming runtime makes it: the
    same run directory, tool, arguments and attempt give the same call_id, and the writer asks
    the target before anything runs (docs/runtime-authors.md, "From the command line"). None for
    another tool, which only its own runtime can call."""
    if call.tool not in BUILTIN_ADAPTERS:
        return None
    args = protocol.canonical_json(call.args).decode() if call.args is not None else ""
    words = ["python", "-m", "receipts", "call", call.run.path, "--tool", call.tool]
    if call.attempt is not None:
        words += ["--attempt", str(call.attempt)]
    return shlex.join(words) + " --args " + (shlex.quote(args) if args and len(args) <= RESUME_ARGS_MAX else "ARGS")
