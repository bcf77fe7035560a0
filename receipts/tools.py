"""Tools with side effects: the adapter interface, the outcomes an adapter signals, the built-ins.

Standard library only. An adapter normalises its args (before the call_id is
computed from them), executes with the call_id as the target's idempotency key,
and may ``query`` the target for an outcome in doubt.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

from receipts.durable import ShortWriteError, exclusive_lock, write_all, write_durable
from receipts.protocol import WRITER_DIR, canonical_json, format_time, sha256_hex, utc_now


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
    """A side-effecting tool. ``query`` exists only on adapters that can ask the target."""

    name: ClassVar[str]
    version: ClassVar[str]

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]: ...

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]: ...


def adapter_can_query(adapter: Any) -> bool:
    return callable(getattr(adapter, "query", None))


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


class WriteFile:
    """Writes ``content`` to ``RUN_DIR/workspace/<path>``; can check the file's digest."""

    name = "write_file"
    version = "1.0.0"

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        values = _require_text(args, "path", "content")
        path = posixpath.normpath(values["path"].replace("\\", "/"))
        if path.startswith(("/", "../")) or path in (".", "..") or "\x00" in path:
            raise Rejected(f"path {values['path']!r} leaves the workspace")
        return {"path": path, "content": values["content"]}

    def _target(self, run_dir: Path, args: Mapping[str, Any]) -> Path:
        return Path(run_dir) / "workspace" / args["path"]

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        target = self._target(run_dir, args)
        write_durable(target, args["content"].encode("utf-8"))
        return self._result(args, target.read_bytes())

    def query(self, run_dir: Path, args: Mapping[str, Any]) -> dict[str, Any] | None:
        """The result when the file holds the content already, else ``None``."""
        try:
            present = self._target(run_dir, args).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            return None
        if present != args["content"].encode("utf-8"):
            return None
        return self._result(args, present)

    def _result(self, args: Mapping[str, Any], present: bytes) -> dict[str, Any]:
        expected = sha256_hex(args["content"].encode("utf-8"))
        if sha256_hex(present) != expected:
            raise OutcomeUnknown("the file does not hold what was written")
        return {"path": f"workspace/{args['path']}", "file_sha256": expected}


class SendMessage:
    """Appends a message to ``RUN_DIR/outbox.jsonl``. Not queryable, as e-mail is not."""

    name = "send_message"
    version = "1.0.0"

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
        with exclusive_lock(Path(run_dir) / WRITER_DIR / "outbox.lock"):
            fd = os.open(Path(run_dir) / "outbox.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                write_all(fd, line)
                os.fsync(fd)
            except ShortWriteError as error:
                if error.written == 0:
                    raise Rejected(f"the outbox took no byte: {error.strerror}", kind="retryable") from error
                # Part of the line is in the outbox: whether the message counts is not ours to say.
                raise OutcomeUnknown(f"the outbox write stopped short: {error.strerror}") from error
            finally:
                os.close(fd)
        return {"outbox": "outbox.jsonl", "remote_resource_id": message_id, "message_sha256": sha256_hex(line[:-1])}


BUILTIN_ADAPTERS: dict[str, Adapter] = {adapter.name: adapter for adapter in (WriteFile(), SendMessage())}
