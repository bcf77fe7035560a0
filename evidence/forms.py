"""The dashboard's one form: a person settles a call in doubt."""

from __future__ import annotations

from django import forms

from receipts import protocol


class ConfirmForm(forms.Form):
    """The fields the interface docs name; ``confirm_queryable`` is the second tick for a queryable call."""

    resolution = forms.ChoiceField(
        choices=[("committed", "It happened (committed)"), ("rejected", "It did not happen (rejected)")],
        widget=forms.RadioSelect,
    )
    reason = forms.CharField(
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="What you checked, so the runtime's operator can follow it.",
    )
    confirm_call_id = forms.CharField(
        label="Type the first 12 characters of the call_id",
        max_length=64,
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false", "size": 14}),
    )
    receipt_sha256 = forms.RegexField(regex=protocol.HEX64_RE.pattern, widget=forms.HiddenInput)
    confirm_queryable = forms.BooleanField(
        required=False, label="Decide anyway, although the runtime could ask the target itself"
    )
