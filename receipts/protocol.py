"""The run directory contract: formulas, strict JSON, durable writes, the ledger.

Everything here follows ``RUN_DIRECTORY.md`` to the letter and uses the
standard library only, so an agent runtime can vendor this file (and
``runtime.py``) without Django.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import fcntl
import hashlib
import itertools
import json
import math
import os
import re
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

IDENTITY_V1 = "call-id-v1"
IDENTITY_V2 = "call-id-v2"
IDENTITIES = (IDENTITY_V1, IDENTITY_V2)
DIGEST_SCHEMA = "write-task-v1"
REQUEST_FIELDS = (
    "sender",
    "recipient",
    "subject",
    "body",
    "priority",
    "thread_key",
    "parent",
    "references",
    "depends_on",
    "risk_level",
)
RECEIPT_STATUSES = ("prepared", "committed", "rejected", "unknown")
LEGACY_STATUS = "failed"
SUBMISSION_STATES = ("reserved", "task_created", "committed")
DISPOSITIONS = ("created", "reused", "conflict")
ZERO_HASH = "0" * 64
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
RUN_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
HEX64_RE = re.compile(r"[0-9a-f]{64}")
MAX_JSON_DEPTH = 256


def canonical_json(value: Any) -> bytes:
    """The one byte form every digest is taken over."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def valid_run_id(name: str) -> bool:
    """1-128 characters of ``[A-Za-z0-9._-]``, not starting with a dot."""
    return bool(RUN_ID_RE.fullmatch(name)) and not name.startswith(".")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_call_id(
    contract_sha256: str,
    attempt: int,
    tool: str,
    args: Any,
    tool_version: str | None = None,
    identity: str = IDENTITY_V1,
) -> str:
    identity_object: dict[str, Any] = {
        "contract_sha256": contract_sha256,
        "attempt": attempt,
        "tool": tool,
        "args": args,
    }
    if identity == IDENTITY_V2:
        identity_object["tool_version"] = tool_version
    elif identity != IDENTITY_V1:
        raise ValueError(f"unknown identity formula {identity!r}")
    return sha256_hex(canonical_json(identity_object))


def _normalise_text(value: Any) -> Any:
    # Line ends first, then NFC: the order the spec fixes.
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value.replace("\r\n", "\n").replace("\r", "\n"))
    if isinstance(value, list):
        return [_normalise_text(item) for item in value]
    if isinstance(value, dict):
        return {_normalise_text(key): _normalise_text(item) for key, item in value.items()}
    return value


def semantic_request(request: Mapping[str, Any]) -> dict[str, Any]:
    """The ten fields of ``write-task-v1``, as given; a missing one is null."""
    return {field: copy.deepcopy(request.get(field)) for field in REQUEST_FIELDS}


def request_digest(request: Mapping[str, Any]) -> str:
    return sha256_hex(canonical_json(_normalise_text(semantic_request(request))))


def input_sha256(args: Any) -> str:
    return sha256_hex(canonical_json(args))


def utc_now() -> dt.datetime:
    """Now, or the fixed instant in ``RECEIPTS_CLOCK`` (tests and demos only)."""
    fixed = os.environ.get("RECEIPTS_CLOCK")
    if fixed:
        return parse_time(fixed)
    return dt.datetime.now(dt.UTC)


def format_time(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> dt.datetime:
    """RFC 3339 to an aware UTC datetime; ``ValueError`` for anything else."""
    if not isinstance(text, str):
        raise ValueError("time is not a string")
    moment = dt.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError(f"time without a zone: {text!r}")
    return moment if moment.tzinfo is dt.UTC else moment.astimezone(dt.UTC)


# --- strict JSON -----------------------------------------------------------


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {text[:40]}")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"duplicate key {duplicate[:80]!r}")
    return result


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_tree(value: Any) -> None:
    # Iterative so that depth is bounded by MAX_JSON_DEPTH, not the C stack.
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"nesting deeper than {MAX_JSON_DEPTH}")
        if isinstance(item, str):
            if _has_surrogate(item):
                raise ValueError("lone surrogate in a string")
        elif isinstance(item, dict):
            for key, child in item.items():
                if _has_surrogate(key):
                    raise ValueError("lone surrogate in a key")
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_constant=_refuse_constant, parse_float=_finite_float)


def load_json_strict(data: bytes) -> Any:
    """Parse one JSON document under the run directory's rules.

    Raises ``ValueError`` (and nothing else) for a BOM, invalid UTF-8, NaN or
    Infinity, a number that overflows to infinity, a duplicate key, a lone
    surrogate or nesting too deep.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError("load_json_strict takes bytes")
    data = bytes(data)
    if data.startswith(b"\xef\xbb\xbf"):
        raise ValueError("byte order mark")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"invalid UTF-8 at byte {error.start}") from None
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise ValueError("nesting too deep") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"invalid JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
    # Valid UTF-8 cannot carry a surrogate, so only a \u escape can make one; and
    # nesting deeper than the limit needs more brackets than the limit. Most
    # documents have neither, and skip the walk.
    if "\\u" in text or text.count("[") + text.count("{") > MAX_JSON_DEPTH:
        _check_tree(value)
    return value


# --- durable files ---------------------------------------------------------


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name_for(path: Path) -> Path:
    """A fresh temp name beside ``path`` that readers ignore (leading dot, ``.tmp``)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")


def temp_files_of(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f".{glob_escape(path.name)}.*.tmp"))


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _write_temp(path: Path, data: bytes) -> Path:
    temp = temp_name_for(path)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        # An fsync error is fatal: the caller never gets to call this durable.
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    os.close(fd)
    return temp


def write_durable(path: Path, data: bytes, before_replace: Callable[[], None] | None = None) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    Temp file in the same directory (exclusive create), write, fsync, rename
    onto the final name, fsync the directory. ``before_replace`` runs between
    the temp file and the rename (a failpoint lives there).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = _write_temp(path, data)
    if before_replace is not None:
        before_replace()
    try:
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    fsync_directory(path.parent)


def create_durable(path: Path, data: bytes) -> None:
    """Create ``path`` holding ``data``; ``FileExistsError`` when it exists.

    The content is fsynced under a temp name, then hard-linked onto the
    final name: ``link`` fails when the target exists and never exposes a
    half-written file, which ``O_EXCL`` on the final name would.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = _write_temp(path, data)
    try:
        os.link(temp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)
    fsync_directory(path.parent)


def remove_temp_files(path: Path) -> list[Path]:
    """Remove the temp files a crash left beside ``path``; returns them."""
    removed = []
    for temp in temp_files_of(path):
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
            removed.append(temp)
    return removed


@contextlib.contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``lock_path``, held for the block."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# --- the ledger ------------------------------------------------------------

LEDGER_NAME = "events.jsonl"


def _complete_end(fd: int, size: int) -> int:
    """Where the complete lines end: a torn tail left by a crash mid-append is not an event."""
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    return _last_newline_end(fd, size)


def _lines_backwards(fd: int, end: int) -> Iterator[bytes]:
    """Complete lines (without ``\\n``) from the one ending at ``end`` back to the first."""
    while end > 0:
        start = _last_newline_end(fd, end - 1)
        yield os.pread(fd, end - 1 - start, start)
        end = start


def _last_newline_end(fd: int, before: int) -> int:
    """Offset just after the last ``\\n`` strictly before ``before`` (0 if none)."""
    position = before
    chunk = 65536
    while position > 0:
        start = max(0, position - chunk)
        block = os.pread(fd, position - start, start)
        index = block.rfind(b"\n")
        if index >= 0:
            return start + index + 1
        position = start
    return 0


def _last_seq(lines: Iterator[bytes]) -> int:
    """The seq of the last line that is a valid event; a hostile line never stops the writer."""
    for line in lines:
        try:
            event = load_json_strict(line)
        except ValueError:
            continue
        seq = event.get("seq") if isinstance(event, dict) else None
        if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0:
            return seq
    return 0


def append_event(run_dir: Path, event_type: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Append one event to the run's ledger under an exclusive lock.

    Assigns ``seq`` (last + 1) and ``prev_sha256`` (digest of the last line's
    bytes), writes one ``\\n``-terminated line and fsyncs it.
    """
    ledger = Path(run_dir) / LEDGER_NAME
    fd = os.open(ledger, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        end = _complete_end(fd, size)
        if end != size:
            os.ftruncate(fd, end)
        # The chain covers the last line's bytes whatever they are; seq follows the last valid event.
        lines = _lines_backwards(fd, end)
        last_line = next(lines, None)
        prev_sha256 = ZERO_HASH if last_line is None else sha256_hex(last_line)
        seq = 1 if last_line is None else _last_seq(itertools.chain([last_line], lines)) + 1
        event = {"seq": seq, "ts": format_time(utc_now()), "type": event_type, "prev_sha256": prev_sha256}
        event.update({key: value for key, value in fields.items() if key not in event})
        line = canonical_json(event) + b"\n"
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        return event
    finally:
        os.close(fd)
