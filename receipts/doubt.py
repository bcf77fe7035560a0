"""What a person needs to settle a call in doubt: the call in plain words, and what the target shows.

Standard library only, and read-only: evidence functions look at the run
directory as a reader does (no symlink followed, nothing outside the run
opened) and never change it. The built-in tools' adapters have theirs
(``receipts.tools``); a runtime with other tools gives its adapters an
``evidence(run_dir, args, call_id, result=None)`` method, or registers a
function for a tool name with ``register_evidence``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from receipts.tools import (
    ABSENT,
    BUILTIN_ADAPTERS,
    PRESENT,
    UNCLEAR,
    Evidence,
    send_message_evidence,
    short_text,
    write_file_evidence,
)

__all__ = [
    "ABSENT",
    "PRESENT",
    "UNCLEAR",
    "Evidence",
    "describe",
    "evidence_for",
    "register_adapter",
    "register_evidence",
    "send_message_evidence",
    "write_file_evidence",
]

EvidenceFunction = Callable[[Path, Mapping[str, Any], str], Evidence]
# A page reads this much of the end of an outbox, not a whole outbox of any size on every view.
PAGE_OUTBOX_BYTES = 8 * 2**20
_REGISTRY: dict[str, EvidenceFunction] = {
    "send_message": functools.partial(send_message_evidence, tail_bytes=PAGE_OUTBOX_BYTES),
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
        return Evidence(UNCLEAR, (f"the evidence could not be read: {type(error).__name__}: {error}",))


def describe(tool: str, args: Any) -> str:
    """What the call was meant to do, in plain words."""
    if tool in _DESCRIPTIONS:
        try:
            return short_text(_DESCRIPTIONS[tool](args), 500)
        except Exception:  # noqa: BLE001, S110 - the plain description below says it as well
            pass
    if isinstance(args, dict) and tool == "send_message":
        return f"Send a message to {short_text(args.get('to'))}: “{short_text(args.get('body'), 200)}”"
    if isinstance(args, dict) and tool == "write_file":
        content = args.get("content")
        size = len(content.encode("utf-8", "surrogatepass")) if isinstance(content, str) else "?"
        return f"Write {size} bytes to workspace/{short_text(args.get('path'))}"
    shown = short_text(json.dumps(args, sort_keys=True, ensure_ascii=False), 300)
    return f"Run the tool {short_text(tool, 80)} with {shown}"
