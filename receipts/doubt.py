"""What a person needs to settle a call in doubt: the call in plain words, and what the target shows.

Standard library only, and read-only: evidence functions look at the run
directory as a reader does (no symlink followed, nothing outside the run
opened) and never change it. The built-in tools' adapters have theirs
(``receipts.tools``); a runtime with other tools gives its adapters an
``evidence(run_dir, args, call_id, result=None)`` method, or registers a
function for a tool name with ``register_evidence``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from receipts.adapters.smtp import email_evidence
from receipts.builtin_tools import BUILTIN_ADAPTERS
from receipts.tools import (
    ABSENT,
    PRESENT,
    UNCLEAR,
    Evidence,
    Fact,
    send_message_evidence,
    short_text,
    write_file_evidence,
)

__all__ = [
    "ABSENT",
    "PRESENT",
    "UNCLEAR",
    "Evidence",
    "Reading",
    "describe",
    "evidence_for",
    "reading",
    "register_adapter",
    "register_evidence",
    "send_message_evidence",
    "times_shown",
    "write_file_evidence",
]

EvidenceFunction = Callable[[Path, Mapping[str, Any], str], Evidence]
# A page reads this much of the end of an outbox, not a whole outbox of any size on every view.
PAGE_OUTBOX_BYTES = 8 * 2**20
_REGISTRY: dict[str, EvidenceFunction] = {
    "send_message": functools.partial(send_message_evidence, tail_bytes=PAGE_OUTBOX_BYTES),
    # No server is asked: the panel says what to search the mailbox for (the Message-ID).
    "send_email": email_evidence,
}
_DESCRIPTIONS: dict[str, Callable[[Any], str]] = {}


def register_evidence(tool: str, function: EvidenceFunction) -> None:
    """Let the dashboard show what ``tool``'s target says about a call (``function(run_dir, args, call_id)``)."""
    _REGISTRY[tool] = function


def register_adapter(adapter: Any) -> None:
    """Let the dashboard use a configured adapter's ``evidence`` (and ``describe(args)``, when it has one)
    for calls of its tool (``EVIDENCE_ADAPTERS`` builds them at start-up)."""
    if callable(getattr(adapter, "evidence", None)):
        register_evidence(adapter.name, adapter.evidence)
    if callable(getattr(adapter, "describe", None)):
        _DESCRIPTIONS[adapter.name] = adapter.describe


def evidence_for(
    run_dir: Path, tool: str, args: Any, call_id: str, adapters: Mapping[str, Any] = BUILTIN_ADAPTERS
) -> Evidence | None:
    """The target's evidence for one call, or ``None`` when nothing can look for this tool."""
    function = _REGISTRY.get(tool) or getattr(adapters.get(tool), "evidence", None)
    if function is None or not isinstance(args, dict):
        return None
    try:
        return function(Path(run_dir), args, call_id)
    except Exception as error:  # noqa: BLE001 - another runtime's function: its failure is a fact, not a page error
        return Evidence(UNCLEAR, (Fact("unreadable", error=f"{type(error).__name__}: {error}"),))


# The facts that each stand for one effect on the target: a line of the outbox that carries the call_id.
EFFECT_FACTS = frozenset({"outbox_line"})


def times_shown(evidence: Evidence) -> int:
    """How many effects ``evidence`` shows for its call: its facts that each stand for one (an
    adapter's other facts count none, whatever they say)."""
    return sum(1 for fact in evidence.facts if getattr(fact, "key", None) in EFFECT_FACTS)


@dataclasses.dataclass(frozen=True)
class Reading:
    """What the target's evidence most likely means, and the resolution it points to."""

    resolution: str  # committed or rejected
    sentence: str


# What the built-in tools' evidence means, said of their targets: (present, absent).
MEANINGS = {
    "send_message": ("the message was sent", "no message was sent"),
    "write_file": ("the file holds what the call writes", "the file was never written"),
}


def reading(tool: str, evidence: Evidence | None, *, queried: bool = False) -> Reading | None:
    """What ``evidence`` most likely means (``None`` when it is unclear or there is none): a
    person still decides, and says why; the evidence is what the target shows now.

    ``queried``: the runtime asks the target itself when the run resumes (its decision is
    ``query``), so the evidence says what that answer will most likely be, not how to settle.
    """
    if evidence is None or evidence.verdict not in (PRESENT, ABSENT):
        return None
    present, absent = MEANINGS.get(tool, ("the target shows the effect", "the target does not show the effect"))
    if evidence.verdict == PRESENT:
        then = "a resume will find it done and reuse it" if queried else "settle it as committed"
        return Reading("committed", f"{present}: {then}")
    if queried:
        return Reading("rejected", f"{absent}: a resume will find it not done and run it again")
    then = "settle it as rejected (the runtime retries it)"
    return Reading("rejected", f"{absent}: {then}")


def describe(tool: str, args: Any) -> str:
    """What the call was meant to do, in plain words."""
    if tool in _DESCRIPTIONS:
        try:
            return short_text(_DESCRIPTIONS[tool](args), 500)
        except Exception:  # noqa: BLE001, S110 - the plain description below says it as well
            pass
    if isinstance(args, dict) and tool == "send_message":
        return f"Send a message to {short_text(args.get('to'))}: “{short_text(args.get('body'), 200)}”"
    if isinstance(args, dict) and tool == "send_email":
        recipients = args.get("to")
        shown = ", ".join(map(short_text, recipients)) if isinstance(recipients, list) else short_text(recipients)
        return f"Send an e-mail to {short_text(shown, 300)}: “{short_text(args.get('subject'), 200)}”"
    if isinstance(args, dict) and tool == "write_file":
        content = args.get("content")
        size = len(content.encode("utf-8", "surrogatepass")) if isinstance(content, str) else "?"
        return f"Write {size} bytes to workspace/{short_text(args.get('path'))}"
    shown = short_text(json.dumps(args, sort_keys=True, ensure_ascii=False), 300)
    return f"Run the tool {short_text(tool, 80)} with {shown}"
