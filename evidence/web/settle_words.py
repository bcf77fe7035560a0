"""Why a settle recorded nothing, as the call's page says it, in the reader's language (the web layer
words what the review room refuses with).

``settle.settle_call`` refuses with data: a code (``settle.ALREADY_DECIDED``...) and the values it
quotes, raw as the records hold them (a person's name, a protocol word, an RFC 3339 time, an
error's text). Here each code is a sentence of the catalogue; the values inside are data
(``translate="no"``, escaped), a protocol word in the reader's language, a time as pages show it.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext, gettext_noop

from evidence.review import settle
from evidence.words import decision_text, i18n

# A problem of one field of the form: what the person does about it.
FIELD_PROBLEMS = {
    settle.CHOOSE_RESOLUTION: gettext_noop("Choose whether the call happened (committed) or not (rejected)."),
    settle.GIVE_REASON: gettext_noop("Give the reason for your decision: the runtime's operator reads it."),
    settle.TYPE_CALL_ID: gettext_noop("Type the first 12 characters of this call's call_id to confirm."),
    settle.TICK_QUERYABLE: gettext_noop(
        "The runtime can check this call with its target by itself. Tick the box to decide anyway."
    ),
    settle.TICK_AGAINST_EVIDENCE: gettext_noop(
        "What the target shows contradicts your answer. Tick the box to decide against it, or choose the other answer."
    ),
}

# A refusal of the run's writer, each quoting the problem it gave.
WRITER_PROBLEMS = {
    settle.WRITER_REFUSED: gettext_noop("Nothing was recorded: {problem}."),
    settle.CANNOT_WRITE: gettext_noop("The run directory cannot be written ({problem}): nothing was recorded."),
    settle.UNSAFE_PATH: gettext_noop(
        "The run directory has a symlink or an odd file where the writer records ({problem}): it is never written "
        "through, and nothing was recorded. The run's findings say what is there."
    ),
    settle.WRITER_CANNOT: gettext_noop(
        "The writer cannot record a decision in this run ({problem}): nothing was recorded."
    ),
}


def _data(value: object) -> SafeString:
    """A value a message quotes (a name, a reason, an error): data, never translated."""
    return format_html('<span translate="no">{}</span>', value)


def field_problems(problems: Mapping[str, str]) -> dict[str, str]:
    """Each field's problem (its code) as the sentence the form shows beside it."""
    return {field: gettext(FIELD_PROBLEMS[code]) for field, code in problems.items()}


def refusal(refused: settle.SettleError) -> str | SafeString:
    """The sentence of a refusal that is not about one field."""
    code, values = refused.code, refused.values
    if code == settle.ALREADY_DECIDED:
        # The name stays bare text: it opens the sentence the English pages and tests read whole.
        return format_html(
            gettext("{actor} already settled this call as {resolution} at {time}: “{reason}”. "
                    "A decision is not changed."),
            actor=values["actor"],
            resolution=i18n.word(values["resolution"]),
            time=i18n.shown_time(values["time"]),
            reason=_data(values["reason"]),
        )  # fmt: skip
    if code == settle.NO_RECEIPT:
        return gettext("This call has no receipt: a decision has nothing to hold to. Its findings say what is known.")
    if code == settle.NOT_IN_DOUBT:
        return format_html(
            gettext("This call is not in doubt: {reason}."), reason=decision_text.reason_shown(str(values["reason"]))
        )
    if code == settle.RECEIPT_CHANGED:
        if values.get("now_status") is None:
            now_says: str | SafeString = gettext("it can no longer be read as a receipt")
        else:
            now_says = format_html(
                gettext("it now says {status}, updated at {time}"),
                status=i18n.word(values["now_status"]),
                time=i18n.shown_time(values["now_updated_at"]),
            )
        return format_html(
            gettext("The receipt changed since this page showed it ({status}): {now}. The runtime moved on; nothing "
                    "was recorded. Look again before deciding."),
            status=i18n.word(values["status"]),
            now=now_says,
        )  # fmt: skip
    if code == settle.ANOTHER_DECISION_THERE:
        return format_html(
            gettext("The run directory already holds another decision: {actor} settled this call as {resolution} "
                    "at {time} ({reason})."),
            # Bare text: the English pages and tests read this sentence whole.
            actor=values["actor"],
            resolution=i18n.word(values["resolution"]),
            time=i18n.shown_time(values["time"]),
            reason=values["reason"],
        )  # fmt: skip
    if code in WRITER_PROBLEMS:
        return format_html(gettext(WRITER_PROBLEMS[code]), problem=_data(values["problem"]))
    if code == settle.NOT_DECIDED:
        return gettext("No decision made on this dashboard is on record for this call: nothing was withdrawn.")
    if code == settle.ALREADY_DELIVERED:
        return format_html(
            gettext("This decision was written into the run directory by host {host} at {time}: the runtime follows "
                    "it, and it cannot be withdrawn. Nothing was changed."),
            host=format_html('<code translate="no">{}</code>', values["host"] or "?"),
            time=i18n.shown_time(values["time"]),
        )  # fmt: skip
    if code == settle.NOT_WITHDRAWABLE:
        return format_html(
            gettext("The run directory refused this decision ({why}): it stays on record as refused. Nothing was "
                    "changed."),
            why=_data(values["why"]),
        )  # fmt: skip
    raise ValueError(f"a settle refusal no sentence says: {code}")
