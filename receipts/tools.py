"""Tools with side effects: the adapter interface, the outcomes an adapter signals, the built-ins.

Standard library only. An adapter normalises its args (before the call_id is
computed from them), executes with the call_id as the target's idempotency key,
and may ``query`` the target for an outcome in doubt and show a person (or the
writer, before it reuses a commit) what the target holds: ``evidence``. Both
read the target as a reader does: no symlink followed, nothing outside the run
opened, nothing changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import posixpath
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

from receipts.confined import UnsafePath, open_file, read_file
from receipts.durable import (
    LockBusy,
    ShortWriteError,
    flock_within,
    is_temp_name,
    lock_wait_seconds,
    remove_old_temp_files,
    write_all,
    write_durable,
)
from receipts.findings import Sentence
from receipts.protocol import canonical_json, format_time, human_time, sha256_hex, utc_now

PRESENT, ABSENT, UNCLEAR = "present", "absent", "unclear"


# What the built-in targets' evidence functions say they found, in English (the dashboard words
# each in the reader's language from its key and values: evidence/words/doubt_text.py).
FACTS: dict[str, str] = {
    "result_not_object": "the receipt's result is not an object",
    "result_not_returned": "the receipt's result is not what a receipted function returns",
    "unreadable": "the evidence could not be read: {error}",
    "no_outbox": "there is no outbox.jsonl: no message was ever sent in this run",
    "outbox_unreadable": "outbox.jsonl cannot be read: {problem}",
    "outbox_line": "line {number}: message {message_id} to {to}, sent at {sent_at}",
    "not_the_recorded_line": "none of these lines is the one the receipt's result records",
    "outbox_tail": (
        "no line of the last {tail} MiB of outbox.jsonl carries this call_id ({count} lines searched), and the "
        "whole file is {size} MiB: search it for {call_id} (the runtime, resuming, reads it whole)"
    ),
    "no_outbox_line": "no line of outbox.jsonl carries this call_id ({count} lines searched)",
    "same_message": "{count} line(s) without a call_id hold the same recipient and body",
    "torn_lines": "{count} line(s) are not whole JSON (a write that stopped short?)",
    "no_path": "the call's args name no path and content",
    "path_leaves": "the path {path} leaves the workspace",
    "file_missing": "{path} does not exist",
    "file_unsafe": "{path}: {problem}",
    "file_other_bytes": "{path} holds other bytes: sha256 {found}…, the call writes {expected}…",
    "file_other_recorded": "{path} holds sha256 {found}…, the receipt records {recorded}…",
    "file_exact": "{path} holds exactly what the call writes (sha256 {found}…)",
    # apply_changes (receipts.changes)
    "changes_no_tree": "the call's args name no tree",
    "changes_no_record": "{tree}: no record of this call: it never reached the step that makes its version current",
    "changes_current": "{tree} is at the version this call makes ({version}…, {files} files)",
    "changes_other_recorded": "the receipt records version {recorded}…, the call's record names {version}…",
    "changes_at_base": (
        "{tree} is still at the version the call started from ({base}), and nothing ever left the version it "
        "makes ({version}…): it was never made current"
    ),
    "changes_moved": (
        "{tree} is at version {current}: neither the one the call started from ({base}) nor the one it makes "
        "({version}…), or another call made that one too"
    ),
    "changes_left": (
        "{tree} was at the version this call makes ({version}…, from {base}) and a later call left it: it is at "
        "{current} now"
    ),
    "changes_unreadable": "{tree} cannot be read: {problem}",
    "mail_not_asked": "no mail server is asked from here: search the mailbox for Message-ID {message_id}",
    "mail_sent": "sent to {to}, from {sender}",
    "mail_subject": "subject “{subject}”",
    "mail_answered": "the server answered {reply}",
    # the SQL adapter (receipts.adapters.sql)
    "sql_look": "look in table {table} for the row whose {column} is {call_id}",
    "sql_not_connected": "this dashboard does not connect to the database: {look}",
    "sql_unreadable": "table {table} cannot be read: {error}",
    "sql_no_row": "table {table} has no row whose {column} is {call_id}",
    "sql_row": "table {table} holds the row whose {column} is {call_id}: {row}",
    "sql_other_values": "its values are not the call's args",
    "sql_other_row": "the receipt's result records another row",
}


class Fact(Sentence):
    """A fact an evidence function found, in English, with its key (``FACTS``) and values."""

    catalogue = FACTS


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What the target's side shows about one call's effect."""

    verdict: str  # present (the effect is there), absent (it is not), unclear
    facts: tuple[str, ...]


class _NotDone:
    """The type of ``NOT_DONE``: a query's positive evidence that the effect did not happen."""

    def __repr__(self) -> str:
        return "NOT_DONE"


NOT_DONE = _NotDone()


class Rejected(Exception):  # noqa: N818 - it is an outcome, not a failure of ours
    """The target refused or the request was invalid: nothing was executed."""

    def __init__(self, message: str, *, kind: str = "permanent") -> None:
        if kind not in ("retryable", "permanent"):
            raise ValueError(f"unknown rejection kind {kind!r}")
        super().__init__(message)
        self.kind = kind


class OutcomeUnknown(Exception):  # noqa: N818 - it is an outcome, not a failure of ours
    """The request may have taken effect (a timeout after sending)."""


class Adapter(Protocol):
    """A side-effecting tool.

    Optional methods, on adapters whose target can answer them:

    - ``query(run_dir, args, call_id)``: whether the effect of a call in doubt
      happened. It returns the result the call would have returned when the
      target shows the effect, ``NOT_DONE`` only on positive evidence that it did
      not happen, and raises ``OutcomeUnknown`` when it cannot tell. Anything else
      it returns counts as "cannot tell": only those two answers move the writer.
    - ``evidence(run_dir, args, call_id, result=None) -> Evidence``: what the
      target shows, read-only, for a person; with ``result``, ``present`` only
      when the target shows that very result. The writer asks it before reusing a
      committed receipt, unless the adapter sets ``checks_commits = False`` (it
      cannot look at its target: a commit is then reused on its receipt's check alone).
    """

    # Read-only: a class attribute (``name = "write_file"``), a ClassVar or a property all serve.
    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]: ...

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]: ...


def adapter_can_query(adapter: Any) -> bool:
    """What the adapter declares, never what a receipt file claims."""
    return callable(getattr(adapter, "query", None))


def tool_can_query(adapters: Mapping[str, Any], tool: str) -> bool:
    """Whether the adapter registered for ``tool`` can ask its target (an unknown tool cannot)."""
    adapter = adapters.get(tool)
    return adapter is not None and adapter_can_query(adapter)


def _require_text(args: Mapping[str, Any], *names: str) -> dict[str, str]:
    if not isinstance(args, Mapping):
        raise Rejected("args must be a JSON object")
    unknown = set(args) - set(names)
    if unknown:
        raise Rejected(f"unknown argument(s): {', '.join(sorted(unknown))}")
    values = {}
    for name in names:
        value = args.get(name)
        if not isinstance(value, str):
            raise Rejected(f"argument {name!r} must be a string")
        values[name] = value
    return values


def normal_workspace_path(given: str) -> str:
    """A relative path in the workspace, normalised (``a/./b`` is ``a/b``); ``Rejected`` when it leaves it."""
    path = posixpath.normpath(given.replace("\\", "/"))
    if path.startswith(("/", "../")) or path in (".", "..") or "\x00" in path:
        raise Rejected(f"path {given!r} leaves the workspace")
    if any(is_temp_name(part) for part in path.split("/")):
        # The writer's temp files are named so; such a file would be swept as one a dead writer left.
        raise Rejected(f"path {given!r} is named like the writer's temp files (.<name>.<pid>.<hex>.tmp)")
    return path


class WriteFile:
    """Writes ``content`` to ``RUN_DIR/workspace/<path>``; can check the file's digest."""

    name = "write_file"
    version = "1.0.0"
    # One call, for the conformance kit (`callproof conformance receipts.tools:WriteFile`).
    example_args: ClassVar[dict[str, str]] = {"path": "notes/example.txt", "content": "written once\n"}

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        values = _require_text(args, "path", "content")
        return {"path": normal_workspace_path(values["path"]), "content": values["content"]}

    def _target(self, run_dir: Path, args: Mapping[str, Any]) -> Path:
        return Path(run_dir) / "workspace" / args["path"]

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        target = self._target(run_dir, args)
        remove_old_temp_files(target, Path(run_dir))
        try:
            write_durable(target, args["content"].encode("utf-8"), root=Path(run_dir))
        except UnsafePath as unsafe:
            # Refused before a byte was written: a symlinked folder on the way is never followed.
            raise Rejected(f"workspace/{args['path']}: {unsafe}") from None
        return self._result(args, read_file(target, Path(run_dir)))

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any] | _NotDone:
        """The result when the file holds the content; ``NOT_DONE`` when there is no file.

        Other bytes in the file prove nothing either way (another call may have
        written there since): ``OutcomeUnknown``, and a person decides.
        """
        found = self.evidence(run_dir, args, call_id)
        if found.verdict == PRESENT:
            return self._result(args, args["content"].encode("utf-8"))
        if found.verdict == ABSENT:
            return NOT_DONE
        raise OutcomeUnknown("; ".join(found.facts))

    def evidence(
        self, run_dir: Path, args: Mapping[str, Any], call_id: str, result: Mapping[str, Any] | None = None
    ) -> Evidence:
        """Whether the workspace file exists and holds what the call writes (and, given, its result's digest)."""
        return write_file_evidence(run_dir, args, call_id, result)

    def _result(self, args: Mapping[str, Any], present: bytes) -> dict[str, Any]:
        expected = sha256_hex(args["content"].encode("utf-8"))
        if sha256_hex(present) != expected:
            raise OutcomeUnknown("the file does not hold what was written")
        return {"path": f"workspace/{args['path']}", "file_sha256": expected}


class SendMessage:
    """Appends a message to ``RUN_DIR/outbox.jsonl``. Not queryable, as e-mail is not."""

    name = "send_message"
    version = "1.0.0"
    # One call, for the conformance kit (`callproof conformance receipts.tools:SendMessage`).
    example_args: ClassVar[dict[str, str]] = {"to": "ops@example.com", "body": "sent once"}

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        values = _require_text(args, "to", "body")
        if not values["to"].strip():
            raise Rejected("argument 'to' is empty")
        return {"to": values["to"].strip(), "body": values["body"]}

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        # The call_id is the target's idempotency key, and the message id is what
        # the target gives back: a person checking the outbox finds the line by either.
        message_id = f"msg-{os.urandom(8).hex()}"
        message = {
            "call_id": call_id,
            "message_id": message_id,
            "to": args["to"],
            "body": args["body"],
            "sent_at": format_time(utc_now()),
        }
        line = canonical_json(message) + b"\n"
        try:
            fd = open_file(Path(run_dir) / "outbox.jsonl", Path(run_dir), os.O_RDWR | os.O_CREAT | os.O_APPEND)
        except UnsafePath as unsafe:
            raise Rejected(f"the outbox is not written: {unsafe}") from None
        # The outbox itself is the lock: a writer daemon's agent may write the outbox, never .writer/.
        # So the agent may hold it too: the wait is bounded, and a busy outbox took nothing.
        with _flocked(fd, Path(run_dir) / "outbox.jsonl"):
            # A write that stopped short left a torn last line: it stays (it is evidence for
            # the call it belongs to), and this message starts a line of its own.
            size = os.fstat(fd).st_size
            separator = b"\n" if size and os.pread(fd, 1, size - 1) != b"\n" else b""
            try:
                write_all(fd, separator + line)
                os.fsync(fd)
            except ShortWriteError as error:
                if error.written <= len(separator):
                    raise Rejected(f"the outbox took no byte: {error.strerror}", kind="retryable") from error
                # Part of the line is in the outbox: whether the message counts is not ours to say.
                raise OutcomeUnknown(f"the outbox write stopped short: {error.strerror}") from error
        return {"outbox": "outbox.jsonl", "remote_resource_id": message_id, "message_sha256": sha256_hex(line[:-1])}

    def evidence(
        self, run_dir: Path, args: Mapping[str, Any], call_id: str, result: Mapping[str, Any] | None = None
    ) -> Evidence:
        """The outbox lines carrying this call_id (and, given a result, the one with its digest)."""
        return send_message_evidence(run_dir, args, call_id, result)


@contextlib.contextmanager
def _flocked(fd: int, path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on an open file for the block (``Rejected``, retryable, when another
    process holds it past ``lock_wait_seconds``); the file is closed after it."""
    try:
        try:
            flock_within(fd, path, lock_wait_seconds())
        except LockBusy as busy:
            raise Rejected(f"the outbox is not written: {busy}", kind="retryable") from None
        yield
    finally:
        os.close(fd)


# --- what the built-in targets show ------------------------------------------------


def send_message_evidence(
    run_dir: Path,
    args: Mapping[str, Any],
    call_id: str,
    result: Mapping[str, Any] | None = None,
    *,
    tail_bytes: int | None = None,
) -> Evidence:
    """The outbox lines that carry this call_id (the target's idempotency key).

    With ``result`` (a committed receipt's), ``present`` needs the line whose
    digest is the result's ``message_sha256`` and whose message id is its
    ``remote_resource_id``: a line edited since, or another line, is not it.

    ``tail_bytes``: read only the outbox's last bytes (a page shows a call in doubt,
    whose line is most likely near the end, without reading a huge outbox on every view).
    What is found there is evidence; finding nothing there proves nothing, and says so.
    The writer always reads the whole outbox.
    """
    if result is not None and not isinstance(result, Mapping):
        return Evidence(UNCLEAR, (Fact("result_not_object"),))
    try:
        fd = open_file(Path(run_dir) / "outbox.jsonl", Path(run_dir), os.O_RDONLY)
    except FileNotFoundError:
        return Evidence(ABSENT, (Fact("no_outbox"),))
    except UnsafePath as unsafe:
        return Evidence(UNCLEAR, (Fact("outbox_unreadable", problem=unsafe),))
    carrying, matching, without_id, torn, count = [], [], 0, 0, 0
    # Streamed: an outbox has no size limit, and a line past any cap would be "not there".
    with os.fdopen(fd, "rb") as outbox:
        size = os.fstat(outbox.fileno()).st_size
        tail = size if tail_bytes is None else tail_bytes
        skipped = size > tail
        if skipped:
            outbox.seek(size - tail - 1)
            outbox.readline()  # the rest of a line that starts before the tail
        wanted = call_id.encode()
        for count, line in enumerate(outbox, start=1):
            if b'"call_id"' in line and wanted not in line and b"\\u" not in line:
                # Another call's line, for sure: with no \u escape, JSON's bytes are the text's,
                # so this call's id would be there. Not parsing it makes a big outbox cheap.
                continue
            found = _outbox_line(line.rstrip(b"\n"), count, call_id, args, result)
            if found is None:
                torn += 1
            elif found == "":
                continue
            elif found == "same":
                without_id += 1
            else:
                carrying.append(found[0])
                if found[1]:
                    matching.append(found[0])
    if result is not None:
        if matching:
            return Evidence(PRESENT, tuple(matching))
        if carrying:
            return Evidence(UNCLEAR, (*carrying, Fact("not_the_recorded_line")))
    elif carrying:
        return Evidence(PRESENT, tuple(carrying))
    if skipped:
        return Evidence(UNCLEAR, (
            Fact("outbox_tail", tail=tail // 2**20, count=count, size=f"{size / 2**20:.0f}", call_id=call_id),
        ))  # fmt: skip
    facts = [Fact("no_outbox_line", count=count)]
    if without_id:
        facts.append(Fact("same_message", count=without_id))
    if torn:
        facts.append(Fact("torn_lines", count=torn))
    return Evidence(UNCLEAR if without_id or torn else ABSENT, tuple(facts))


def _outbox_line(
    line: bytes, number: int, call_id: str, args: Mapping[str, Any], result: Mapping[str, Any] | None
) -> Any:
    """What one outbox line says of this call: ``None`` torn, ``""`` nothing, ``"same"`` an old line
    without a call_id holding the same message, or ``(fact, is the line the result records)``."""
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict):
        return ""
    if message.get("call_id") == call_id:
        sent_at = message.get("sent_at")
        fact = Fact(
            "outbox_line",
            number=number,
            message_id=short_text(message.get("message_id")),
            to=short_text(message.get("to")),
            sent_at=short_text(human_time(sent_at) if isinstance(sent_at, str) else sent_at),
        )
        return fact, result is not None and _is_the_recorded_line(line, message, result)
    if "call_id" not in message and message.get("to") == args.get("to") and message.get("body") == args.get("body"):
        return "same"
    return ""


def _is_the_recorded_line(line: bytes, message: Mapping[str, Any], result: Mapping[str, Any]) -> bool:
    return sha256_hex(line) == result.get("message_sha256") and message.get("message_id") == result.get(
        "remote_resource_id"
    )


def write_file_evidence(
    run_dir: Path, args: Mapping[str, Any], call_id: str, result: Mapping[str, Any] | None = None
) -> Evidence:
    """Whether the workspace file exists, and whether it holds what the call writes.

    With ``result``, ``present`` also needs the file's digest to be the
    result's ``file_sha256``.
    """
    path, content = args.get("path"), args.get("content")
    if result is not None and not isinstance(result, Mapping):
        return Evidence(UNCLEAR, (Fact("result_not_object"),))
    if not isinstance(path, str) or not isinstance(content, str):
        return Evidence(UNCLEAR, (Fact("no_path"),))
    parts = posixpath.normpath(path).split("/")
    if parts[0] in ("", ".", "..") or ".." in parts:
        return Evidence(UNCLEAR, (Fact("path_leaves", path=repr(path)),))
    try:
        found = _sha256_below(Path(run_dir), ["workspace", *parts])
    except FileNotFoundError:
        return Evidence(ABSENT, (Fact("file_missing", path=f"workspace/{path}"),))
    except UnsafePath as unsafe:
        return Evidence(UNCLEAR, (Fact("file_unsafe", path=f"workspace/{path}", problem=unsafe),))
    expected = sha256_hex(content.encode("utf-8"))
    if found != expected:
        return Evidence(
            UNCLEAR,
            (Fact("file_other_bytes", path=f"workspace/{path}", found=found[:12], expected=expected[:12]),),
        )
    if result is not None and result.get("file_sha256") != found:
        recorded = short_text(result.get("file_sha256"), 12)
        return Evidence(
            UNCLEAR, (Fact("file_other_recorded", path=f"workspace/{path}", found=found[:12], recorded=recorded),)
        )
    return Evidence(PRESENT, (Fact("file_exact", path=f"workspace/{path}", found=found[:12]),))


def _sha256_below(root: Path, parts: list[str]) -> str:
    """The digest of a file under ``root``, read in chunks (a file of any size is judged whole)."""
    digest = hashlib.sha256()
    with os.fdopen(open_file(root.joinpath(*parts), root, os.O_RDONLY), "rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def short_text(value: Any, limit: int = 120) -> str:
    """``value`` as text for a sentence, cut to ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"
