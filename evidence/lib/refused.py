"""A request refused with a 400 that says why, in English for programs and in the reader's
language on the page."""

from __future__ import annotations

from django.core.exceptions import BadRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext


class Refused(BadRequest):
    """A 400 that says what was wrong with a request: its text is English (the API's
    ``detail``, the log), and the 400 page says it in the reader's language with each value
    (what was sent, what is allowed) in ``<code>``: values are data.

    ``message`` is a msgid marked with ``gettext_noop``, with ``{name}`` placeholders.
    """

    def __init__(self, message: str, **values: object) -> None:
        self.message, self.values = message, values
        super().__init__(message.format(**values))

    def shown(self) -> SafeString:
        """The message in the reader's language, as HTML: the values in ``<code>``."""
        return format_html(
            gettext(self.message),
            **{name: format_html("<code>{}</code>", value) for name, value in self.values.items()},
        )
