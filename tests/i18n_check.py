"""What a person reads on a page, and which of it is English interface text.

Data is what a record or a person wrote (run ids, tool names, reasons, JSON): the pages put
it in ``<code>``, ``<pre>`` or an element with ``translate="no"`` (the HTML attribute that
also keeps a browser's own translator off ids). Everything else a person reads is the
interface: in Chinese it must hold no English word. An identifier (``call_id``,
``steer.json``), an acronym (``CSV``) or a product's name is not an English word.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

# Elements whose content is data or machine text, never interface.
DATA_ELEMENTS = {"code", "pre", "kbd", "samp", "script", "style", "template"}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
# Attributes a person reads (or hears, from a screen reader).
READ_ATTRIBUTES = {
    "title",
    "aria-label",
    "placeholder",
    "alt",
    "data-label",
    "aria-description",
    "aria-roledescription",
}
# Names, not English: kept as they are in every language (docs/glossary.md).
NAMES = {"Callproof", "PostgreSQL", "SQLite", "Django", "Prometheus", "Playwright", "MCP", "gettext", "htmx"}
WORD = re.compile(r"[A-Za-z][A-Za-z'’]+")
# A token with a digit, an underscore, a dot, a slash, a hyphen, @ or : inside is an identifier.
TOKEN = re.compile(r"[\w.\-/@:'’]+")


def english_words(text: str) -> list[str]:
    """The English words of ``text``: not identifiers, acronyms or names."""
    found = []
    for token in TOKEN.findall(text):
        core = token.strip(".:-/'’")
        if not WORD.fullmatch(core) or core in NAMES or core.isupper():
            continue
        found.append(core)
    return found


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool]] = []  # (tag, is data)
        self.texts: list[str] = []

    @property
    def in_data(self) -> bool:
        return bool(self.stack) and self.stack[-1][1]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        data = self.in_data or tag in DATA_ELEMENTS or values.get("translate") == "no"
        if not data:
            for name, value in attrs:
                # An input button shows its value; a <button>'s value is what it sends, unseen.
                shown_value = name == "value" and tag == "input" and values.get("type") in {"submit", "button"}
                if value and (name in READ_ATTRIBUTES or shown_value):
                    if tag == "time" and name == "title":
                        continue  # the exact instant, for machines and the curious
                    self.texts.append(value)
        if tag not in VOID:
            self.stack.append((tag, data))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID and self.stack and self.stack[-1][0] == tag:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, -1, -1):
            if self.stack[depth][0] == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        if not self.in_data and data.strip():
            self.texts.append(data)


def interface_texts(page: str) -> list[str]:
    """Every piece of interface text on ``page`` (data left out)."""
    reader = _Reader()
    reader.feed(page)
    reader.close()
    return reader.texts


def english_on(page: str) -> list[str]:
    """Each interface text of ``page`` that holds an English word."""
    return [" ".join(text.split())[:120] for text in interface_texts(page) if english_words(text)]
