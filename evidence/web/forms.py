"""The dashboard's forms: a person settles a call in doubt, or triages a finding."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django import forms
from django.contrib.auth.forms import AuthenticationForm
from django.core.validators import MaxLengthValidator, validate_email
from django.utils.functional import Promise
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from evidence.review import alerts, inbox, triage
from evidence.web import settle_words
from receipts import protocol

StrOrPromise = str | Promise

# What a person types in a box of text is at most this long (a settle's, a triage's or a legal
# hold's reason): enforced here, said beside the field, and the browser stops at it (maxlength).
REASON_LIMIT = triage.REASON_LIMIT


def reason_field(help_text: StrOrPromise, **options) -> forms.CharField:
    """A reason a person types: required, at most ``REASON_LIMIT`` characters (the help text beside
    it says so), no NUL (Django's CharField refuses it, which PostgreSQL's text would with a 500)."""
    return forms.CharField(
        max_length=REASON_LIMIT,
        help_text=format_lazy("{} {}", help_text, format_lazy(_("At most {limit} characters."), limit=REASON_LIMIT)),
        **options,
    )


class ConfirmForm(forms.Form):
    """The fields the interface docs name; ``confirm_queryable`` is the second tick for a queryable call.

    The form checks shapes (a known choice, a bounded length, a digest); what a settle needs (an
    answer, a reason, the call_id typed) is ``settle.field_problems``'s, said for every field at once,
    so nothing here is required."""

    resolution = forms.ChoiceField(
        choices=[("committed", _("It happened (committed)")), ("rejected", _("It did not happen (rejected)"))],
        widget=forms.RadioSelect,
        required=False,
    )
    reason = reason_field(
        _("What you checked, so the runtime's operator can follow it."),
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        required=False,
    )
    confirm_call_id = forms.CharField(
        label=_("Type the first 12 characters of the call_id"),
        required=False,
        max_length=64,
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false", "size": 14}),
    )
    receipt_sha256 = forms.RegexField(regex=protocol.HEX64_RE.pattern, widget=forms.HiddenInput)
    confirm_queryable = forms.BooleanField(
        required=False, label=_("Decide anyway, although the runtime could ask the target itself")
    )
    # The second confirmation of an answer the target's evidence contradicts (``settle.against_evidence``).
    confirm_against_evidence = forms.BooleanField(
        required=False, label=_("I have checked the target myself: decide against what it shows")
    )

    def settle_fields(self) -> dict:
        """What ``settle.settle_call`` and ``settle.field_problems`` take, from what the form took
        (a field it refused is empty: its own error is the one shown)."""
        data = self.cleaned_data
        return {
            "resolution": data.get("resolution", ""),
            "reason": data.get("reason", ""),
            "typed_call_id": data.get("confirm_call_id", ""),
            "confirm_queryable": data.get("confirm_queryable", False),
            "confirm_against_evidence": data.get("confirm_against_evidence", False),
        }

    def add_problems(self, problems: dict[str, str]) -> None:
        """The settle's problems (``settle.field_problems``: each field's code) beside their
        fields in the reader's language, but for a field the form already refused."""
        for field, message in settle_words.field_problems(problems).items():
            if field not in self.errors:
                self.add_error(field, message)


# How long a snooze lasts: until the import sees the finding change, for a while, or until a time.
SNOOZES = {
    "change": (_("until it changes"), None),
    "1h": (_("for an hour"), dt.timedelta(hours=1)),
    "1d": (_("for a day"), dt.timedelta(days=1)),
    "7d": (_("for a week"), dt.timedelta(days=7)),
    "time": (_("until a time (UTC)"), None),
}


class TriageForm(forms.Form):
    """Acknowledge or snooze a finding, or undo either (``evidence.review.triage.act`` checks the rest)."""

    action = forms.ChoiceField(choices=[(action, action) for action in triage.ACTIONS], widget=forms.HiddenInput)
    reason = reason_field(
        _("Why it can wait, or why it cannot any more: the next person to look reads it."),
        widget=forms.Textarea(attrs={"rows": 2, "cols": 50}),
    )
    snooze = forms.ChoiceField(
        choices=[(value, label) for value, (label, _length) in SNOOZES.items()],
        widget=forms.RadioSelect,
        required=False,
        initial="change",
        label=_("Snooze"),
    )
    until = forms.DateTimeField(
        required=False,
        label=_("Until (UTC)"),
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"],
    )
    next = forms.CharField(required=False, widget=forms.HiddenInput)

    def clean(self) -> dict:
        data = super().clean() or {}
        if data.get("action") == triage.SNOOZE:
            if not data.get("snooze"):
                self.add_error("snooze", _("Say how long: until it changes, for a while, or until a time."))
            elif data["snooze"] == "time" and data.get("until") is None and "until" not in self.errors:
                self.add_error("until", _("Give the time the snooze ends, in UTC."))
        return data

    def snooze_end(self, now: dt.datetime) -> tuple[dt.datetime | None, bool]:
        """(until when, whether until it changes), from the valid form's choice (nothing when the
        act is not a snooze)."""
        choice = self.cleaned_data.get("snooze") or ""
        if self.cleaned_data.get("action") != triage.SNOOZE or not choice:
            return None, False
        if choice == "change":
            return None, True
        if choice == "time":
            until = self.cleaned_data["until"]
            # The field is in UTC, whatever the server's zone: the page says so.
            return until.replace(tzinfo=dt.UTC) if until.tzinfo is None else until.astimezone(dt.UTC), False
        length = SNOOZES[choice][1]
        assert length is not None  # the choices with no length are handled above
        return now + length, False


class LegalHoldForm(forms.Form):
    """Set or lift a run's legal hold, with the reason that is stored, audited and shown."""

    hold = forms.ChoiceField(choices=[("set", "set"), ("lift", "lift")], widget=forms.HiddenInput)
    reason = reason_field(
        _("Why the run must be kept, or why it need not any more: it is audited and shown on the run's page."),
        error_messages={"required": _("A legal hold is set or lifted with a reason.")},
        widget=forms.TextInput(attrs={"size": 28, "placeholder": _("reason (audited)")}),
    )


# A login's user name is at most what the user table holds (150): Django's form sets only the
# input's maxlength, and a longer name reached django-axes, whose column holds 255 (a 500).
class BoundedLogin:
    fields: dict

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        username = self.fields["username"]
        username.validators.append(MaxLengthValidator(username.max_length))
        self.fields["password"].validators.append(MaxLengthValidator(PASSWORD_LIMIT))
        self.fields["password"].widget.attrs["maxlength"] = PASSWORD_LIMIT


PASSWORD_LIMIT = 1024  # hashing is slow on purpose (Argon2): a megabyte's guess would cost the server


class LoginForm(BoundedLogin, AuthenticationForm):
    """The dashboard's login."""


class NotificationRuleForm(forms.Form):
    """A notification rule (evidence/review/alerts.py): a destination and the filters; the admin role's."""

    name = forms.CharField(label=_("Name"), max_length=200)
    channel = forms.ChoiceField(label=_("Send by"), choices=[("webhook", _("webhook")), ("email", _("e-mail"))])
    url = forms.CharField(label=_("Webhook address"), max_length=2000, required=False,
                          help_text=_("http or https; a Slack incoming webhook works as it is."))  # fmt: skip
    secret = forms.CharField(label=_("Signing secret"), max_length=200, required=False,
                             help_text=_("The receiver checks the Callproof-Signature header with it."))  # fmt: skip
    emails = forms.CharField(label=_("E-mail addresses"), max_length=4000, required=False, widget=forms.Textarea(
        attrs={"rows": 2}), help_text=_("One a line."))  # fmt: skip
    runs = forms.CharField(label=_("Runs"), max_length=200, required=False,
                           help_text=_("A pattern of run ids (nightly-*); empty: every run."))  # fmt: skip
    host = forms.CharField(label=_("Host"), max_length=200, required=False,
                           help_text=_("Only the runs of this host; empty: every host."))  # fmt: skip
    tools = forms.CharField(label=_("Tools"), max_length=4000, required=False,
                            help_text=_("Calls of these tools only, one a line; empty: every item."))  # fmt: skip
    severities = forms.MultipleChoiceField(label=_("Severities"), required=False, widget=forms.CheckboxSelectMultiple,
                                           choices=[("error", _("error")), ("warning", _("warning"))])  # fmt: skip
    kinds = forms.MultipleChoiceField(label=_("Kinds"), required=False, widget=forms.CheckboxSelectMultiple)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        kinds = [(kind, inbox.KIND_LABELS[kind]) for kind in inbox.KINDS]
        self.fields["kinds"].choices = kinds  # type: ignore[attr-defined]  # a MultipleChoiceField

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("channel") == "webhook":
            url = data.get("url", "")
            if not url.startswith(("http://", "https://")):
                self.add_error("url", _("A webhook address starts with http:// or https://."))
            if not data.get("secret"):
                self.add_error("secret", _("A webhook is signed with a secret: give one."))
        elif data.get("channel") == "email":
            addresses = alerts.lines(data.get("emails", ""))
            if not addresses:
                self.add_error("emails", _("Give at least one e-mail address."))
            for address in addresses:
                try:
                    validate_email(address)
                except forms.ValidationError:
                    self.add_error("emails", _("%(address)s is not an e-mail address.") % {"address": address})
                    break
        return data
