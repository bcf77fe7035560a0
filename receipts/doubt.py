"""What a person needs to settle a call in doubt: the call in plain words, and what the target shows.

Standard library only, and read-only: evidence functions look at the run
directory as a reader does (no symlink followed, nothing outside the run
opened) and never change it. The built-in tools have theirs; a runtime with
other tools gives its adapters an ``evidence(run_dir, args, call_id)`` method,
or registers a function for a tool name with ``register_evidence``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.reader.safe_open import Unsafe, open_dir, open_regular

PRESENT, ABSENT, UNCLEAR = "present", "absent", "unclear"
# An outbox can grow without end; the page reads this much of it at the most.
MAX_OUTBOX_BYTES = 64 * 1024 * 1024
MAX_EVIDENCE_FILE_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What the target's side shows about one call's effect."""

    verdict: str  # present (the effect is there), absent (it is not), unclear
    facts: tuple[str, ...]


EvidenceFunction = Callable[[Path, Mapping[str, Any], str], Evidence]
_REGISTRY: dict[str, EvidenceFunction] = {}


def register_evidence(tool: str, function: EvidenceFunction) -> None:
    """Let the dashboard show what ``tool``'s target says about a call (``function(run_dir, args, call_id)``)."""
    _REGISTRY[tool] = function


def evidence_for(
    run_dir: Path, tool: str, args: Any, call_id: str, adapters: Mapping[str, Any] | None = None
) -> Evidence | None:
    """The target's evidence for one call, or ``None`` when nothing can look for this tool."""
    function = _REGISTRY.get(tool)
    if function is None and adapters is not None:
        function = getattr(adapters.get(tool), "evidence", None)
    if function is None or not isinstance(args, dict):
        return None
    try:
        return function(Path(run_dir), args, call_id)
    except (OSError, ValueError, KeyError, TypeError) as error:
        return Evidence(UNCLEAR, (f"the evidence could not be read: {type(error).__name__}: {error}",))


def describe(tool: str, args: Any) -> str:
    """What the call was meant to do, in plain words."""
    if isinstance(args, dict) and tool == "send_message":
        return f"Send a message to {_text(args.get('to'))}: “{_text(args.get('body'), 200)}”"
    if isinstance(args, dict) and tool == "write_file":
        content = args.get("content")
        size = len(content.encode("utf-8", "surrogatepass")) if isinstance(content, str) else "?"
        return f"Write {size} bytes to workspace/{_text(args.get('path'))}"
    return f"Run the tool {_text(tool, 80)} with {_text(json.dumps(args, sort_keys=True, ensure_ascii=False), 300)}"


def _text(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def send_message_evidence(run_dir: Path, args: Mapping[str, Any], call_id: str) -> Evidence:
    """The outbox lines that carry this call_id (the target's idempotency key)."""
    try:
        lines = _outbox_lines(run_dir)
    except FileNotFoundError:
        return Evidence(ABSENT, ("there is no outbox.jsonl: no message was ever sent in this run",))
    except Unsafe as unsafe:
        return Evidence(UNCLEAR, (f"outbox.jsonl cannot be read: {unsafe.detail}",))
    carrying, without_id, torn = [], 0, 0
    for number, line in lines:
        try:
            message = json.loads(line)
        except ValueError:
            torn += 1
            continue
        if not isinstance(message, dict):
            continue
        if message.get("call_id") == call_id:
            carrying.append(
                f"line {number}: message {_text(message.get('message_id'))} to {_text(message.get('to'))}, "
                f"sent at {_text(message.get('sent_at'))}"
            )
        elif (
            "call_id" not in message and message.get("to") == args.get("to") and message.get("body") == args.get("body")
        ):
            without_id += 1
    if carrying:
        return Evidence(PRESENT, tuple(carrying))
    facts = [f"no line of outbox.jsonl carries this call_id ({len(lines)} lines searched)"]
    if without_id:
        facts.append(f"{without_id} line(s) without a call_id hold the same recipient and body")
    if torn:
        facts.append(f"{torn} line(s) are not whole JSON (a write that stopped short?)")
    return Evidence(UNCLEAR if without_id or torn else ABSENT, tuple(facts))


def _outbox_lines(run_dir: Path) -> list[tuple[int, bytes]]:
    data = _read_below(run_dir, ["outbox.jsonl"], MAX_OUTBOX_BYTES)
    return list(enumerate(data.splitlines(), start=1))


def write_file_evidence(run_dir: Path, args: Mapping[str, Any], call_id: str) -> Evidence:
    """Whether the workspace file exists, and whether it holds what the call would write."""
    path, content = args.get("path"), args.get("content")
    if not isinstance(path, str) or not isinstance(content, str):
        return Evidence(UNCLEAR, ("the call's args name no path and content",))
    parts = posixpath.normpath(path).split("/")
    if parts[0] in ("", ".", "..") or ".." in parts:
        return Evidence(UNCLEAR, (f"the path {path!r} leaves the workspace",))
    try:
        data = _read_below(Path(run_dir), ["workspace", *parts], MAX_EVIDENCE_FILE_BYTES)
    except FileNotFoundError:
        return Evidence(ABSENT, (f"workspace/{path} does not exist",))
    except Unsafe as unsafe:
        return Evidence(UNCLEAR, (f"workspace/{path}: {unsafe.detail}",))
    expected = protocol.sha256_hex(content.encode("utf-8"))
    found = protocol.sha256_hex(data)
    if found == expected:
        return Evidence(PRESENT, (f"workspace/{path} holds exactly what the call writes (sha256 {found[:12]}…)",))
    return Evidence(
        UNCLEAR,
        (f"workspace/{path} holds other bytes: sha256 {found[:12]}…, the call writes {expected[:12]}…",),
    )


def _read_below(root: Path, parts: list[str], limit: int) -> bytes:
    """A regular file under ``root``, opened one directory at a time with no symlink followed."""
    fd = open_dir(root)
    try:
        for part in parts[:-1]:
            next_fd = open_dir(part, fd)
            os.close(fd)
            fd = next_fd
        file_fd, _ = open_regular(parts[-1], fd)
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "rb") as stream:
        return stream.read(limit)


register_evidence("send_message", send_message_evidence)
register_evidence("write_file", write_file_evidence)
