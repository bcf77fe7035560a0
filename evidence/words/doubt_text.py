"""The doubt panel's sentences in the reader's language (docs/glossary.md).

``receipts.doubt`` says what a call was meant to do and what its target's evidence most
likely means, in English: it is standard library only and speaks to programs. The page says
the same in the reader's language. A sentence is translated only when it is exactly the one
``receipts.doubt`` writes for a built-in tool (the values it quotes marked as data); a
sentence a runtime's own adapter writes, and every fact an evidence function finds, is data:
shown as it was written, inside ``translate="no"``.
"""

from __future__ import annotations

import json
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from evidence.words.finding_words import data, said
from receipts import doubt, tools
from receipts.tools import short_text

# What the built-in tools' calls were meant to do (receipts.doubt.describe, word for word).
DESCRIPTIONS = {
    "send_message": gettext_noop("Send a message to {to}: “{body}”"),
    "send_email": gettext_noop("Send an e-mail to {to}: “{subject}”"),
    "write_file": gettext_noop("Write {size} bytes to {path}"),
}
# Any other tool with no description of its own; the tool's name stays bare, an identifier.
ANY_TOOL = gettext_noop("Run the tool {tool} with {args}")

# What the evidence means, said of the target (receipts.doubt.MEANINGS): (present, absent).
MEANINGS = {
    "send_message": (gettext_noop("the message was sent"), gettext_noop("no message was sent")),
    "write_file": (gettext_noop("the file holds what the call writes"), gettext_noop("the file was never written")),
}
ANY_MEANING = (gettext_noop("the target shows the effect"), gettext_noop("the target does not show the effect"))
# What follows from it: (present, absent), for a person who settles, or for a resume that queries.
SETTLE = (gettext_noop("settle it as committed"), gettext_noop("settle it as rejected (the runtime retries it)"))
QUERIED = (
    gettext_noop("a resume will find it done and reuse it"),
    gettext_noop("a resume will find it not done and run it again"),
)


def code(value: object) -> SafeString:
    return format_html("<code>{}</code>", value)


# What the built-in evidence functions find (receipts.tools.FACTS, word for word).
FACTS = {
    "result_not_object": gettext_noop("the receipt's result is not an object"),
    "result_not_returned": gettext_noop("the receipt's result is not what a receipted function returns"),
    "unreadable": gettext_noop("the evidence could not be read: {error}"),
    "no_outbox": gettext_noop("there is no outbox.jsonl: no message was ever sent in this run"),
    "outbox_unreadable": gettext_noop("outbox.jsonl cannot be read: {problem}"),
    "outbox_line": gettext_noop("line {number}: message {message_id} to {to}, sent at {sent_at}"),
    "not_the_recorded_line": gettext_noop("none of these lines is the one the receipt's result records"),
    "outbox_tail": gettext_noop(
        "no line of the last {tail} MiB of outbox.jsonl carries this call_id ({count} lines searched), and the "
        "whole file is {size} MiB: search it for {call_id} (the runtime, resuming, reads it whole)"
    ),
    "no_outbox_line": gettext_noop("no line of outbox.jsonl carries this call_id ({count} lines searched)"),
    "same_message": gettext_noop("{count} line(s) without a call_id hold the same recipient and body"),
    "torn_lines": gettext_noop("{count} line(s) are not whole JSON (a write that stopped short?)"),
    "no_path": gettext_noop("the call's args name no path and content"),
    "path_leaves": gettext_noop("the path {path} leaves the workspace"),
    "file_missing": gettext_noop("{path} does not exist"),
    "file_unsafe": gettext_noop("{path}: {problem}"),
    "file_other_bytes": gettext_noop("{path} holds other bytes: sha256 {found}…, the call writes {expected}…"),
    "file_other_recorded": gettext_noop("{path} holds sha256 {found}…, the receipt records {recorded}…"),
    "file_exact": gettext_noop("{path} holds exactly what the call writes (sha256 {found}…)"),
    "changes_no_tree": gettext_noop("the call's args name no tree"),
    "changes_no_record": gettext_noop(
        "{tree}: no record of this call: it never reached the step that makes its version current"
    ),
    "changes_current": gettext_noop("{tree} is at the version this call makes ({version}…, {files} files)"),
    "changes_other_recorded": gettext_noop(
        "the receipt records version {recorded}…, the call's record names {version}…"
    ),
    "changes_at_base": gettext_noop(
        "{tree} is still at the version the call started from ({base}), and nothing ever left the version it "
        "makes ({version}…): it was never made current"
    ),
    "changes_moved": gettext_noop(
        "{tree} is at version {current}: neither the one the call started from ({base}) nor the one it makes "
        "({version}…), or another call made that one too"
    ),
    "changes_left": gettext_noop(
        "{tree} was at the version this call makes ({version}…, from {base}) and a later call left it: it is at "
        "{current} now"
    ),
    "changes_unreadable": gettext_noop("{tree} cannot be read: {problem}"),
    "mail_not_asked": gettext_noop("no mail server is asked from here: search the mailbox for Message-ID {message_id}"),
    "mail_sent": gettext_noop("sent to {to}, from {sender}"),
    "mail_subject": gettext_noop("subject “{subject}”"),
    "mail_answered": gettext_noop("the server answered {reply}"),
    "sql_look": gettext_noop("look in table {table} for the row whose {column} is {call_id}"),
    "sql_not_connected": gettext_noop("this dashboard does not connect to the database: {look}"),
    "sql_unreadable": gettext_noop("table {table} cannot be read: {error}"),
    "sql_no_row": gettext_noop("table {table} has no row whose {column} is {call_id}"),
    "sql_row": gettext_noop("table {table} holds the row whose {column} is {call_id}: {row}"),
    "sql_other_values": gettext_noop("its values are not the call's args"),
    "sql_other_row": gettext_noop("the receipt's result records another row"),
}


def _described(tool: str, args: Any) -> tuple[str, dict[str, str], dict[str, SafeString]] | None:
    """The built-in sentence for this call: (its msgid, its values as text, the same marked)."""
    if isinstance(args, dict) and tool == "send_message":
        to, body = short_text(args.get("to")), short_text(args.get("body"), 200)
        return DESCRIPTIONS[tool], {"to": to, "body": body}, {"to": data(to), "body": data(body)}
    if isinstance(args, dict) and tool == "send_email":
        recipients = args.get("to")
        shown = ", ".join(map(short_text, recipients)) if isinstance(recipients, list) else short_text(recipients)
        to, subject = short_text(shown, 300), short_text(args.get("subject"), 200)
        return DESCRIPTIONS[tool], {"to": to, "subject": subject}, {"to": data(to), "subject": data(subject)}
    if isinstance(args, dict) and tool == "write_file":
        content = args.get("content")
        size = str(len(content.encode("utf-8", "surrogatepass"))) if isinstance(content, str) else "?"
        path = f"workspace/{short_text(args.get('path'))}"
        return DESCRIPTIONS[tool], {"size": size, "path": path}, {"size": format_html("{}", size), "path": code(path)}
    name = short_text(tool, 80)
    shown = short_text(json.dumps(args, sort_keys=True, ensure_ascii=False), 300)
    return ANY_TOOL, {"tool": name, "args": shown}, {"tool": format_html("{}", name), "args": code(shown)}


def description(tool: str, args: Any) -> SafeString:
    """What the call was meant to do, in the reader's language (an adapter's own words as data)."""
    said = doubt.describe(tool, args)
    built = _described(tool, args)
    if built is None or built[0].format(**built[1]) != said:
        return data(said)
    msgid, _text, marked = built
    return format_html(_(msgid), **marked)


def reading(tool: str, evidence: doubt.Evidence | None, *, queried: bool = False) -> doubt.Reading | None:
    """``receipts.doubt.reading``, its sentence in the reader's language."""
    found = doubt.reading(tool, evidence, queried=queried)
    if found is None or evidence is None:
        return None
    meanings = MEANINGS.get(tool, ANY_MEANING)
    if doubt.MEANINGS.get(tool, ANY_MEANING) != meanings:
        return doubt.Reading(found.resolution, data(found.sentence))  # a meaning someone added: as written
    side = 0 if evidence.verdict == doubt.PRESENT else 1
    then = (QUERIED if queried else SETTLE)[side]
    if f"{meanings[side]}: {then}" != found.sentence:
        return doubt.Reading(found.resolution, data(found.sentence))
    # Translators: what the target's evidence means, then what follows from it.
    sentence = format_html(_("{meaning}: {then}"), meaning=_(meanings[side]), then=_(then))
    return doubt.Reading(found.resolution, sentence)


def facts(evidence: doubt.Evidence | None) -> tuple[SafeString, ...]:
    """What an evidence function found: a built-in one's facts (``receipts.tools.Fact``) in the
    reader's language, the values they quote as data; any other fact as data, as written."""
    if evidence is None:
        return ()
    return tuple(
        said(FACTS, tools.FACTS, fact.key, fact.values, fact) if isinstance(fact, tools.Fact) else data(fact)
        for fact in evidence.facts
    )


def elsewhere(host: object) -> SafeString:
    """The one fact the dashboard says itself: the run's target is read on its own host."""
    return format_html(_("the run's files are on host {host}: its target is read there"), host=code(host))
