"""The run directory contract: formulas, strict JSON, durable writes, the ledger.

Everything here follows ``RUN_DIRECTORY.md`` to the letter and uses the
standard library only, so an agent runtime can vendor this file (and
``runtime.py``) without Django.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
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
# The largest integer the format gives a meaning to (seq, attempt, attempts): what a
# 64-bit signed column holds. Larger numbers are a schema error, never a crash.
MAX_INT = 2**63 - 1


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


# --- the identity check ----------------------------------------------------

VERIFIED, MISMATCH, UNVERIFIABLE = "verified", "mismatch", "unverifiable"
_MISMATCH_CODES = ("receipt_name_mismatch", "contract_mismatch", "input_digest_mismatch", "identity_mismatch")


@dataclasses.dataclass(frozen=True)
class IdentityCheck:
    """Whether a receipt is the call it claims to be, and why not."""

    verdict: str  # verified, mismatch, unverifiable
    recomputed_call_id: str  # "" when an input is missing
    inputs: dict[str, Any]  # identity, contract_sha256, attempt, tool, tool_version: what was used
    problems: tuple[tuple[str, str, str, str], ...] = ()  # (finding code, detail, stored, recomputed)

    @property
    def verified(self) -> bool:
        return self.verdict == VERIFIED

    def summary(self) -> str:
        return "; ".join(detail for _, detail, _, _ in self.problems) or "the receipt is the call it claims to be"


def check_receipt_identity(receipt: Mapping[str, Any], *, call_id: str, contract_sha256: str | None) -> IdentityCheck:
    """The one identity check: the writer, replay, the reader and the pages all call it.

    ``call_id`` is the call the receipt must be (its file's stem, or the call
    being made); ``contract_sha256`` is the run's (steer.json). The call_id is
    recomputed from the receipt's own formula, contract, attempt, tool, tool
    version and args. Any difference, or a contract other than the run's, or an
    ``input_sha256`` other than the args' digest, is a mismatch; a missing
    input makes the receipt unverifiable. Only a verified receipt may be reused.
    """
    problems: list[tuple[str, str, str, str]] = []
    declared = receipt.get("call_id")
    if declared != call_id:
        problems.append(
            ("receipt_name_mismatch", "the receipt's call_id is not the call it is filed as", _clip(declared), call_id)
        )
    stored_contract = receipt.get("contract_sha256")
    if stored_contract is not None and contract_sha256 and stored_contract != contract_sha256:
        problems.append(
            (
                "contract_mismatch",
                "the receipt was made under another contract than the run's",
                _clip(stored_contract),
                contract_sha256,
            )
        )
    args = receipt.get("args")
    stored_input = receipt.get("input_sha256")
    if stored_input is not None and isinstance(args, dict) and stored_input != input_sha256(args):
        problems.append(
            ("input_digest_mismatch", "input_sha256 is not the digest of args", _clip(stored_input), input_sha256(args))
        )
    identity = receipt.get("identity", IDENTITY_V1)
    contract = stored_contract if stored_contract is not None else contract_sha256
    inputs = {
        "identity": identity,
        "contract_sha256": contract,
        "attempt": receipt.get("attempt"),
        "tool": receipt.get("tool"),
        "tool_version": receipt.get("tool_version"),
    }
    missing = []
    if identity not in IDENTITIES:
        missing.append(f"unknown identity formula {_clip(identity, 40)!r}")
    if type(inputs["attempt"]) is not int:
        missing.append("no attempt")
    if not isinstance(contract, str) or not contract:
        missing.append("no contract_sha256 here or in steer.json")
    if not isinstance(inputs["tool"], str) or not isinstance(args, dict):
        missing.append("no tool name or args")
    if identity == IDENTITY_V2 and (not isinstance(inputs["tool_version"], str) or not inputs["tool_version"]):
        missing.append("call-id-v2 without tool_version")
    recomputed = ""
    if missing:
        problems.append(("identity_unverifiable", "; ".join(missing), "", ""))
    else:
        version = inputs["tool_version"] if identity == IDENTITY_V2 else None
        recomputed = make_call_id(contract, inputs["attempt"], inputs["tool"], args, version, identity)
        if recomputed != declared:
            problems.append(
                (
                    "identity_mismatch",
                    f"{identity} over contract, attempt {inputs['attempt']}, tool and args gives another call_id",
                    _clip(declared),
                    recomputed,
                )
            )
    if any(code in _MISMATCH_CODES for code, _, _, _ in problems):
        verdict = MISMATCH
    elif problems:
        verdict = UNVERIFIABLE
    else:
        verdict = VERIFIED
    return IdentityCheck(verdict, recomputed, inputs, tuple(problems))


def _clip(value: Any, limit: int = 200) -> str:
    return (value if isinstance(value, str) else json.dumps(value, default=str))[:limit]


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
        raise ValueError(f"time without a zone: {text[:40]!r}")
    if moment.tzinfo is dt.UTC:
        return moment
    try:
        return moment.astimezone(dt.UTC)
    except OverflowError:
        # 0001-01-01T00:00:00+01:00 is a valid RFC 3339 time with no UTC form Python can hold.
        raise ValueError(f"time out of range: {text[:40]!r}") from None


def is_whole_number(value: Any, minimum: int = 0) -> bool:
    """An int (not a bool) from ``minimum`` to ``MAX_INT``."""
    return type(value) is int and minimum <= value <= MAX_INT


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


class ShortWriteError(OSError):
    """A write that stopped before its last byte (a file-size limit, a full disk)."""

    def __init__(self, written: int, total: int, cause: OSError) -> None:
        super().__init__(cause.errno, f"{written} of {total} bytes written: {cause.strerror or cause}")
        self.written = written
        self.total = total


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data``; ``ShortWriteError`` says how many went out when it cannot.

    ``os.write`` may write fewer bytes than asked (near a file-size limit it
    writes what fits, and only the next call fails): the count is never ignored.
    """
    view = memoryview(data)
    written = 0
    while written < len(data):
        try:
            count = os.write(fd, view[written:])
        except OSError as error:
            raise ShortWriteError(written, len(data), error) from error
        if count == 0:
            raise ShortWriteError(written, len(data), OSError(0, "the write made no progress"))
        written += count


def _write_temp(path: Path, data: bytes) -> Path:
    temp = temp_name_for(path)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_all(fd, data)
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


def read_events(run_dir: Path) -> Iterator[dict[str, Any]]:
    """The ledger's valid events in order, streamed; bad lines and a torn tail are passed over.

    For the writer's rare recovery checks. The reader (``receipts.reader``) is
    the one that reports what is wrong with a ledger.
    """
    try:
        stream = open(Path(run_dir) / LEDGER_NAME, "rb")  # noqa: SIM115 - closed below, a generator
    except FileNotFoundError:
        return
    with stream:
        for line in stream:
            if not line.endswith(b"\n"):
                return
            try:
                event = load_json_strict(line[:-1])
            except ValueError:
                continue
            if isinstance(event, dict):
                yield event


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
        try:
            write_all(fd, line)
        except ShortWriteError:
            # Never leave a torn line behind: the ledger stays as it was.
            os.ftruncate(fd, end)
            raise
        os.fsync(fd)
        return event
    finally:
        os.close(fd)
