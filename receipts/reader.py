"""Reading run directories: pure, standard library only, never raises on bad input.

Every file is opened relative to a directory file descriptor with
``O_NOFOLLOW | O_NONBLOCK``: no symlink is followed, nothing outside the run
directory is opened, and a FIFO cannot block the reader. Every check of the
finding table in RUN_DIRECTORY.md is made here; the importer only stores what
comes back. A bad record becomes a finding and never hides the good ones beside it.

Two entry points: ``read_ledger`` streams the event ledger in batches from a
cursor (so a re-import parses only the appended lines), and ``read_run_files``
reads everything else once the ledger's call ids are known.
"""

from __future__ import annotations

import array
import dataclasses
import datetime as dt
import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.findings import LEDGER as LEDGER_SCOPE
from receipts.findings import STICKY, FindingRecord, storable_text
from receipts.runtime import confirmation_problem, render_task

MAX_JSON_BYTES = 16 * 1024 * 1024
MAX_LINE_BYTES = 1024 * 1024
DEFAULT_STALE_AFTER = dt.timedelta(minutes=15)
LEDGER = protocol.LEDGER_NAME
MAX_CALL_ID = 200
MAX_SUBMISSION_ID = 256
BATCH_EVENTS = 20_000


@dataclasses.dataclass(frozen=True)
class Limits:
    max_json_bytes: int = MAX_JSON_BYTES
    max_line_bytes: int = MAX_LINE_BYTES
    stale_after: dt.timedelta = DEFAULT_STALE_AFTER


DEFAULT_LIMITS = Limits()


# --- opening files safely --------------------------------------------------


class Unsafe(Exception):  # noqa: N818 - a verdict on a path, used for control flow inside this module
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_dir(name: str | Path, dir_fd: int | None = None) -> int:
    """A directory fd; ``Unsafe`` for a symlink or anything that is not a directory."""
    try:
        return os.open(name, _OPEN_FLAGS | os.O_DIRECTORY, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Unsafe("unsafe_path", "a symlink or not a directory: not followed") from None
        raise


def open_regular(name: str, dir_fd: int) -> tuple[int, os.stat_result]:
    """An fd on a regular file in ``dir_fd``; ``Unsafe`` for a symlink, FIFO, device or directory."""
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise Unsafe("unsafe_path", "a symlink: not followed") from None
        if error.errno in (errno.EISDIR, errno.ENXIO):
            raise Unsafe("unsafe_path", "not a regular file") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise Unsafe("unsafe_path", "not a regular file")
    return fd, info


def read_regular(name: str, dir_fd: int, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, or ``Unsafe``."""
    fd, info = open_regular(name, dir_fd)
    try:
        if info.st_size > limit:
            raise Unsafe("oversize", f"{info.st_size} bytes, over the limit of {limit}")
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > limit:  # grew while we read
                raise Unsafe("oversize", f"over the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def list_names(dir_fd: int) -> list[str]:
    """Entry names a reader considers: no dot names (temp files, writer internals), no ``.tmp``."""
    with os.scandir(dir_fd) as entries:
        return sorted(e.name for e in entries if not e.name.startswith(".") and not e.name.endswith(".tmp"))


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


# --- the runs root ---------------------------------------------------------


@dataclasses.dataclass
class Discovery:
    runs: list[Path]
    findings: list[FindingRecord]


def looks_like_run(path: Path) -> bool:
    return any(os.path.lexists(path / name) for name in ("steer.json", LEDGER, "state.json"))


def discover_runs(root: Path) -> Discovery:
    """The run directories under ``root`` (or ``root`` itself when it is one).

    Every other entry of the root is reported, never followed: a symlink, a
    name that is not a run_id (or not UTF-8), a regular file, a dot-directory.
    """
    root = Path(root)
    label = storable_text(str(root))
    if ".." in root.parts:
        return Discovery([], [FindingRecord("unsafe_path", label, "a path with '..' in it: not followed")])
    if label != str(root):
        return Discovery([], [FindingRecord("unsafe_path", label, "the path is not UTF-8: not followed")])
    if root.is_symlink():
        return Discovery([], [FindingRecord("unsafe_path", label, "the root is a symlink: not followed")])
    if not root.is_dir():
        return Discovery([], [FindingRecord("unsafe_path", label, "not a directory")])
    if looks_like_run(root):
        if not protocol.valid_run_id(root.name):
            return Discovery([], [FindingRecord("unsafe_path", root.name, "not a valid run_id")])
        return Discovery([root], [])
    runs, findings = [], []
    try:
        names = sorted(os.listdir(root))
    except OSError as error:
        return Discovery([], [FindingRecord("unsafe_path", label, f"cannot be listed: {error.strerror}")])
    for name in names:
        path = root / name
        try:
            kind = path.lstat().st_mode
        except OSError:
            continue  # gone since it was listed
        if stat.S_ISLNK(kind):
            findings.append(FindingRecord("unsafe_path", name, "a symlink in the runs root: not followed"))
        elif not stat.S_ISDIR(kind):
            if stat.S_ISREG(kind):
                findings.append(FindingRecord("not_a_run", name, "a regular file, not a run directory: left alone"))
            else:
                findings.append(FindingRecord("unsafe_path", name, "not a regular file or directory: not opened"))
        elif name.startswith("."):
            findings.append(FindingRecord("not_a_run", name, "a dot-directory, not a run directory: left alone"))
        elif not protocol.valid_run_id(name):
            findings.append(
                FindingRecord("unsafe_path", name, "not a valid run_id (1-128 of A-Za-z0-9._-, no leading dot)")
            )
        else:
            runs.append(path)
    return Discovery(runs, findings)


# --- fingerprint -----------------------------------------------------------

RUN_FOLDERS = ("receipts", "submissions", "tasks", "confirmations")


def run_fingerprint(run_dir: Path) -> str:
    """A digest of every relevant file's name and stat: equal means nothing changed.

    ctime is in it because no program can set it back, so an edit that restores
    size and mtime still changes the fingerprint. Entries are taken in the
    order the directory lists them: an unchanged directory lists the same way,
    and a different order can only cause one needless re-read, never hide a change.
    """
    names: list[str] = []
    numbers = array.array("q")

    def add(name: str, stat_of: Any) -> None:
        names.append(name)
        try:
            info = stat_of()
        except OSError:
            numbers.extend((-1, -1, -1, -1, -1))
            return
        numbers.extend((info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino))

    for name in ("state.json", "steer.json", LEDGER, *RUN_FOLDERS):
        add(name, lambda name=name: os.lstat(run_dir / name))
    for folder in RUN_FOLDERS:
        names.append(f"{folder}/")
        try:
            entries = list(os.scandir(run_dir / folder))
        except OSError:
            continue
        for entry in entries:
            add(entry.name, lambda entry=entry: entry.stat(follow_symlinks=False))
    digest = hashlib.sha256("\0".join(names).encode("utf-8", "surrogateescape"))
    digest.update(numbers.tobytes())
    return digest.hexdigest()


# --- the ledger ------------------------------------------------------------


@dataclasses.dataclass
class LedgerCursor:
    """How far the ledger was read, and what the rest of the reading needs to know of it."""

    offset: int = 0
    prefix_sha256: str = protocol.EMPTY_SHA256
    last_seq: int = 0
    last_line_sha256: str = protocol.ZERO_HASH
    line_no: int = 0
    chained: bool = False  # a line has carried prev_sha256: every later line must
    call_ids: set[str] = dataclasses.field(default_factory=set)
    submission_digests: dict[str, str] = dataclasses.field(default_factory=dict)
    first_ts: dt.datetime | None = None
    last_ts: dt.datetime | None = None


@dataclasses.dataclass(slots=True)
class EventRecord:
    seq: int
    line_no: int
    ts: dt.datetime | None
    type: str
    call_id: str | None
    client_submission_id: str | None
    disposition: str | None
    request_digest: str | None
    line_sha256: str
    payload: str  # the line's JSON text


@dataclasses.dataclass
class LedgerBatch:
    events: list[EventRecord]
    findings: list[FindingRecord]
    cursor: LedgerCursor  # where the ledger stands after this batch
    restarted: bool = False  # the ledger was rewritten: read from scratch, drop what was imported


def _ledger_finding(code: str, line_no: int, detail: str, **values: Any) -> FindingRecord:
    return FindingRecord(code, f"{LEDGER} line {line_no}", detail, scope=LEDGER_SCOPE, **values)


def _short_text(value: Any, limit: int) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= limit else None


def _hash_prefix(fd: int, length: int) -> Any:
    digest = hashlib.sha256()
    position = 0
    while position < length:
        chunk = os.pread(fd, min(1 << 20, length - position), position)
        if not chunk:
            break
        digest.update(chunk)
        position += len(chunk)
    return digest


def read_ledger(
    run_dir: Path, cursor: LedgerCursor | None = None, limits: Limits = DEFAULT_LIMITS, batch_size: int = BATCH_EVENTS
) -> Iterator[LedgerBatch]:
    """Stream the ledger from ``cursor`` in batches of at most ``batch_size`` events.

    A changed prefix yields a sticky ``ledger_rewritten`` finding and the
    ledger is read again from the start (``restarted`` on the first batch). A
    last line without its newline is a write in progress: not read, no finding.
    """
    cursor = dataclasses.replace(cursor or LedgerCursor())
    cursor.call_ids = set(cursor.call_ids)
    cursor.submission_digests = dict(cursor.submission_digests)
    try:
        run_fd = open_dir(run_dir)
    except (Unsafe, OSError) as error:
        yield LedgerBatch([], [FindingRecord("unsafe_path", str(run_dir), str(error))], cursor)
        return
    try:
        try:
            fd, info = open_regular(LEDGER, run_fd)
        except FileNotFoundError:
            yield LedgerBatch([], [], cursor)
            return
        except Unsafe as unsafe:
            yield LedgerBatch([], [FindingRecord(unsafe.code, LEDGER, unsafe.detail)], cursor)
            return
        try:
            yield from _read_ledger_fd(fd, info.st_size, cursor, limits, batch_size)
        finally:
            os.close(fd)
    finally:
        os.close(run_fd)


def _read_ledger_fd(fd: int, size: int, cursor: LedgerCursor, limits: Limits, batch_size: int) -> Iterator[LedgerBatch]:
    restarted = False
    findings: list[FindingRecord] = []
    digest = _hash_prefix(fd, cursor.offset)
    if cursor.offset and (size < cursor.offset or digest.hexdigest() != cursor.prefix_sha256):
        findings.append(
            FindingRecord(
                "ledger_rewritten",
                LEDGER,
                f"the first {cursor.offset} bytes, already imported, have changed: the ledger was read again",
                stored_value=cursor.prefix_sha256,
                recomputed_value=digest.hexdigest() if size >= cursor.offset else f"the file is {size} bytes now",
                scope=STICKY,
            )
        )
        cursor = LedgerCursor()
        digest = hashlib.sha256()
        restarted = True

    events: list[EventRecord] = []
    with os.fdopen(os.dup(fd), "rb", buffering=1 << 20) as stream:
        stream.seek(cursor.offset)
        max_line = limits.max_line_bytes
        while line := stream.readline(max_line + 1):
            if line[-1:] == b"\n":
                digest.update(line)
                cursor.offset += len(line)
                _take_line(line[:-1], cursor, events, findings)
            elif len(line) <= max_line:
                break  # a write in progress: not read until it is complete
            else:
                extended = _skip_oversize_line(stream, line, cursor, digest, findings, limits)
                if extended is None:
                    break  # an oversize line still being written: not read until it is complete
                digest = extended
            if len(events) >= batch_size:
                cursor.prefix_sha256 = digest.hexdigest()
                yield LedgerBatch(events, findings, dataclasses.replace(cursor), restarted)
                events, findings, restarted = [], [], False
    cursor.prefix_sha256 = digest.hexdigest()
    yield LedgerBatch(events, findings, dataclasses.replace(cursor), restarted)


def _skip_oversize_line(
    stream: Any, head: bytes, cursor: LedgerCursor, digest: Any, findings: list[FindingRecord], limits: Limits
) -> Any:
    """Pass over a line longer than the limit without holding it in memory.

    Returns the prefix digest extended by the line, or ``None`` (and the stream
    back where the line starts) when the line has no end yet.
    """
    trial, line_hash, length, chunk = digest.copy(), hashlib.sha256(), 0, head
    while True:
        trial.update(chunk)
        length += len(chunk)
        if chunk.endswith(b"\n"):
            line_hash.update(chunk[:-1])
            break
        line_hash.update(chunk)
        chunk = stream.readline(1 << 20)
        if not chunk:
            stream.seek(cursor.offset)
            return None
    cursor.offset += length
    cursor.line_no += 1
    cursor.last_line_sha256 = line_hash.hexdigest()
    findings.append(
        _ledger_finding(
            "oversize", cursor.line_no, f"a line of {length - 1} bytes, over {limits.max_line_bytes}: not read"
        )
    )
    return trial


def _take_line(body: bytes, cursor: LedgerCursor, events: list[EventRecord], findings: list[FindingRecord]) -> None:
    """Check one complete ledger line (without its newline); the cursor moves past it.

    The hot path of an import: one call per event, so the common case does as
    little as it can and the rare ones call out.
    """
    cursor.line_no = line_no = cursor.line_no + 1
    previous_line_sha = cursor.last_line_sha256
    cursor.last_line_sha256 = line_sha = hashlib.sha256(body).hexdigest()
    try:
        event = protocol.load_json_strict(body)
    except ValueError as error:
        findings.append(_ledger_finding("invalid_json", line_no, str(error)))
        return
    if type(event) is not dict:
        findings.append(_ledger_finding("schema_error", line_no, "an event must be a JSON object"))
        return
    get = event.get
    seq, event_type = get("seq"), get("type")
    if not protocol.is_whole_number(seq, minimum=1) or type(event_type) is not str:
        findings.append(
            _ledger_finding("schema_error", line_no, f"an event needs a seq from 1 to {protocol.MAX_INT} and a type")
        )
        return
    prev = get("prev_sha256")
    if prev is None and cursor.chained:
        findings.append(
            _ledger_finding(
                "ledger_chain_broken",
                line_no,
                f"seq {seq}: no prev_sha256, but the lines before carry the chain",
                recomputed_value=previous_line_sha,
            )
        )
    elif prev is not None:
        cursor.chained = True
        if prev != previous_line_sha:
            findings.append(
                _ledger_finding(
                    "ledger_chain_broken",
                    line_no,
                    f"seq {seq}: prev_sha256 is not the digest of the line before",
                    stored_value=str(prev)[:200],
                    recomputed_value=previous_line_sha,
                )
            )
    # Each line is judged against the line before, so one wrong seq flags itself and
    # not every line after it. A line whose seq is taken cannot be an event row: its
    # finding keeps it whole.
    if seq != cursor.last_seq + 1:
        _seq_finding(seq, cursor.last_seq, line_no, body, findings)
    cursor.last_seq = seq
    try:
        ts = protocol.parse_time(get("ts"))
    except (ValueError, TypeError):
        ts = None
        findings.append(_ledger_finding("schema_error", line_no, f"seq {seq}: ts is not an RFC 3339 time"))
    else:
        if cursor.first_ts is None or ts < cursor.first_ts:
            cursor.first_ts = ts
        if cursor.last_ts is None or ts > cursor.last_ts:
            cursor.last_ts = ts
    call_id = get("call_id")
    if call_id is not None:
        call_id = call_id if valid_call_name(call_id) else None
        if call_id is None:
            findings.append(_ledger_finding("schema_error", line_no, f"seq {seq}: call_id cannot name a receipt file"))
        else:
            cursor.call_ids.add(call_id)
    submission_id = disposition = request_digest = None
    if event_type == "submission":
        submission_id = _short_text(get("client_submission_id"), MAX_SUBMISSION_ID)
        disposition = get("disposition") if get("disposition") in protocol.DISPOSITIONS else None
        request_digest = _short_text(get("request_digest"), 64)
    event_type = event_type[:64]
    if b"\\u0000" in body:  # rare: only an escape can put U+0000 in a string
        event_type, call_id, submission_id, request_digest = _storable_event_fields(
            line_no,
            findings,
            type=event_type,
            call_id=call_id,
            client_submission_id=submission_id,
            request_digest=request_digest,
        )
    if event_type == "submission":
        _check_submission_event(event, seq, submission_id, disposition, request_digest, cursor, findings)
    events.append(
        EventRecord(
            seq,
            line_no,
            ts,
            event_type,
            call_id,
            submission_id,
            disposition,
            request_digest,
            line_sha,
            body.decode("utf-8"),
        )
    )


def valid_call_name(call_id: Any) -> bool:
    """Whether ``call_id`` can name a receipt file (``receipts/<call_id>.json``) and a page."""
    return (
        isinstance(call_id, str)
        and 0 < len(call_id) <= MAX_CALL_ID
        and "/" not in call_id
        and "\x00" not in call_id
        and not call_id.startswith(".")
    )


def _storable_event_fields(line_no: int, findings: list[FindingRecord], **values: str | None) -> list[str | None]:
    changed = [name for name, value in values.items() if value and "\x00" in value]
    if changed:
        findings.append(
            _ledger_finding(
                "unstorable_value",
                line_no,
                f"U+0000 in {', '.join(changed)}: stored with U+FFFD in its place; the ledger keeps the original",
            )
        )
    return [storable_text(value) if value else value for value in values.values()]


# A hostile ledger may repeat a huge line many times: each finding keeps at most this much of it.
MAX_EVIDENCE_CHARS = 64 * 1024


def _seq_finding(seq: int, last_seq: int, line_no: int, body: bytes, findings: list[FindingRecord]) -> None:
    if seq <= last_seq:
        text = body.decode("utf-8")
        kept = "whole" if len(text) <= MAX_EVIDENCE_CHARS else f"its first {MAX_EVIDENCE_CHARS} characters"
        findings.append(
            _ledger_finding(
                "ledger_seq_duplicate",
                line_no,
                f"seq {seq} after seq {last_seq}: this line is kept here ({kept}), not as an event",
                recomputed_value=hashlib.sha256(body).hexdigest(),
                evidence=text[:MAX_EVIDENCE_CHARS],
            )
        )
    else:
        findings.append(_ledger_finding("ledger_seq_gap", line_no, f"seq {seq} where {last_seq + 1} was due"))


def _check_submission_event(
    event: dict[str, Any],
    seq: int,
    submission_id: str | None,
    disposition: str | None,
    digest: str | None,
    cursor: LedgerCursor,
    findings: list[FindingRecord],
) -> None:
    # Only the values stored on the event row count: an incremental import rebuilds the
    # cursor's digests from those rows, and must judge the next lines as a full read would.
    if submission_id is None:
        return
    subject = f"submission {submission_id}"
    if disposition == "conflict":
        reason = str(event.get("reason"))[:200]
        findings.append(
            FindingRecord(
                "submission_conflict",
                subject,
                f"seq {seq}: disposition conflict ({reason}); no task was written",
                scope=LEDGER_SCOPE,
            )
        )
    if digest is not None:
        first = cursor.submission_digests.setdefault(submission_id, digest)
        if first != digest:
            findings.append(
                FindingRecord(
                    "submission_conflict",
                    f"{subject} digests",
                    f"seq {seq}: one client_submission_id seen with two request digests",
                    stored_value=first,
                    recomputed_value=digest,
                    scope=LEDGER_SCOPE,
                )
            )


# --- everything but the ledger --------------------------------------------


@dataclasses.dataclass
class CallRecord:
    call_id: str
    receipt_present: bool = True
    file_sha256: str = ""
    declared_call_id: str = ""
    status: str = ""
    tool: str = ""
    tool_version: str = ""
    identity: str = ""
    contract_sha256: str = ""
    attempt: int | None = None
    args: Any = None
    input_sha256: str = ""
    output_sha256: str = ""
    result: Any = None
    error: Any = None
    error_kind: str = ""
    queryable: bool = False
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    recomputed_call_id: str = ""
    verification: str = ""
    decision: str = ""
    decision_reason: str = ""


@dataclasses.dataclass
class SubmissionRecord:
    client_submission_id: str
    record_key: str
    file_sha256: str
    digest_schema_version: str = ""
    request_digest: str = ""
    recomputed_digest: str = ""
    request: Any = None
    state: str = ""
    task_id: str = ""
    task_path: str = ""
    task_sha256: str = ""
    task_present: bool = False
    task_file_sha256: str = ""
    task_matches: bool = False  # the file is the one the record describes (or, reserved, would write)
    creation_result: Any = None
    reserved_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None


@dataclasses.dataclass
class ConfirmationRecord:
    call_id: str
    file_sha256: str
    resolution: str = ""
    reason: str = ""
    actor: str = ""
    confirmed_at: dt.datetime | None = None
    receipt_sha256: str = ""
    confirmation_id: str = ""
    valid: bool = False
    problem: str = ""


@dataclasses.dataclass
class RunFiles:
    run_id: str
    state: str = ""
    attempts: int | None = None
    contract_sha256: str = ""
    calls: list[CallRecord] = dataclasses.field(default_factory=list)
    submissions: list[SubmissionRecord] = dataclasses.field(default_factory=list)
    confirmations: list[ConfirmationRecord] = dataclasses.field(default_factory=list)
    findings: list[FindingRecord] = dataclasses.field(default_factory=list)
    next_stale_at: dt.datetime | None = None  # when a finding may appear with no file changing


def _time_field(document: dict[str, Any], name: str) -> dt.datetime | None:
    value = document.get(name)
    if value is None:
        return None
    try:
        return protocol.parse_time(value)
    except (ValueError, TypeError):
        return None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


class _RunReader:
    def __init__(self, run_dir: Path, ledger_call_ids: set[str], limits: Limits, now: dt.datetime) -> None:
        self.run_dir = run_dir
        self.ledger_call_ids = ledger_call_ids
        self.limits = limits
        self.now = now
        self.out = RunFiles(run_id=run_dir.name)
        self.receipt_shas: dict[str, str] = {}
        self.receipt_files: set[str] = set()

    def finding(self, code: str, subject: str, detail: str, **values: str) -> None:
        self.out.findings.append(FindingRecord(code, subject, detail, **values))

    def read_json(self, name: str, dir_fd: int, subject: str) -> tuple[Any, str] | None:
        """The parsed document and the digest of its bytes, or ``None``: after a finding, or
        with none when the file is absent (or was removed since it was listed)."""
        try:
            data = read_regular(name, dir_fd, self.limits.max_json_bytes)
        except FileNotFoundError:
            return None
        except Unsafe as unsafe:
            self.finding(unsafe.code, subject, unsafe.detail)
            return None
        except OSError as error:
            self.finding("unsafe_path", subject, f"cannot be read: {error.strerror}")
            return None
        try:
            return protocol.load_json_strict(data), hashlib.sha256(data).hexdigest()
        except ValueError as error:
            self.finding("invalid_json", subject, str(error))
            return None

    def folder(self, run_fd: int, name: str) -> int | None:
        try:
            return open_dir(name, run_fd)
        except FileNotFoundError:
            return None
        except Unsafe as unsafe:
            self.finding(unsafe.code, f"{name}/", unsafe.detail)
            return None

    def read(self) -> RunFiles:
        try:
            run_fd = open_dir(self.run_dir)
        except (Unsafe, OSError) as error:
            self.finding("unsafe_path", str(self.run_dir), str(error))
            return self.out
        folders: dict[str, int | None] = {}
        try:
            self.read_state(run_fd)
            self.read_steer(run_fd)
            for name in RUN_FOLDERS:
                folders[name] = self.folder(run_fd, name)
            self.read_receipts(folders["receipts"])
            confirmations = self.read_confirmations(folders["confirmations"])
            self.read_submissions(folders["submissions"], folders["tasks"])
            self.cross_check(confirmations)
        finally:
            for fd in folders.values():
                if fd is not None:
                    os.close(fd)
            os.close(run_fd)
        return self.out

    def read_state(self, run_fd: int) -> None:
        parsed = self.read_json("state.json", run_fd, "state.json")
        if parsed is None:
            return
        state, _ = parsed
        name, attempts = (state.get("name"), state.get("attempts")) if isinstance(state, dict) else (None, None)
        if not protocol.is_whole_number(attempts):
            attempts = None
        if not isinstance(name, str) or attempts is None:
            self.finding("schema_error", "state.json", f"needs a string name and attempts from 0 to {protocol.MAX_INT}")
        name = name[:64] if isinstance(name, str) else ""
        if "\x00" in name:
            self.finding("unstorable_value", "state.json", "U+0000 in name: stored with U+FFFD in its place")
        self.out.state = storable_text(name)
        self.out.attempts = attempts

    def read_steer(self, run_fd: int) -> None:
        if not _exists(run_fd, "steer.json"):
            self.finding("schema_error", "steer.json", "missing: receipts' contract cannot be checked")
            return
        parsed = self.read_json("steer.json", run_fd, "steer.json")
        if parsed is None:
            return
        steer, _ = parsed
        contract = steer.get("contract_sha256") if isinstance(steer, dict) else None
        if not isinstance(contract, str) or not protocol.HEX64_RE.fullmatch(contract):
            self.finding("schema_error", "steer.json", "contract_sha256 must be 64 lowercase hex digits")
            return
        self.out.contract_sha256 = contract

    def json_names(self, dir_fd: int, folder: str) -> list[str]:
        """The ``.json`` names of a folder whose names are UTF-8; any other name is a finding."""
        names = []
        for name in list_names(dir_fd):
            if not name.endswith(".json"):
                continue
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                self.finding("unsafe_path", f"{folder}/{name}", "the file name is not UTF-8: not read")
                continue
            names.append(name)
        return names

    def storable(self, record: Any, subject: str) -> None:
        """Replace U+0000 in the record's text fields (the database cannot hold it), with a finding."""
        changed = []
        for field in dataclasses.fields(record):
            value = getattr(record, field.name)
            if isinstance(value, str) and "\x00" in value:
                setattr(record, field.name, storable_text(value))
                changed.append(field.name)
        if changed:
            self.finding(
                "unstorable_value",
                subject,
                f"U+0000 in {', '.join(changed)}: stored with U+FFFD in its place; the file keeps the original",
            )

    def read_receipts(self, dir_fd: int | None) -> None:
        if dir_fd is None:
            return
        for name in self.json_names(dir_fd, "receipts"):
            subject = f"receipts/{name}"
            stem = name[: -len(".json")]
            if len(stem) > MAX_CALL_ID:
                self.finding("unsafe_path", subject, f"file name over {MAX_CALL_ID} characters: not read")
                continue
            self.receipt_files.add(stem)
            parsed = self.read_json(name, dir_fd, subject)
            if parsed is None:
                continue
            receipt, file_sha = parsed
            self.receipt_shas[stem] = file_sha
            call = self.receipt_record(receipt, stem, file_sha, subject)
            if call is not None:
                self.out.calls.append(call)

    def receipt_record(self, receipt: Any, stem: str, file_sha: str, subject: str) -> CallRecord | None:
        if not isinstance(receipt, dict):
            self.finding("schema_error", subject, "a receipt must be a JSON object")
            return None
        missing = [
            name
            for name, kind in (("call_id", str), ("status", str), ("tool", str), ("args", dict))
            if not isinstance(receipt.get(name), kind)
        ]
        if missing:
            self.finding("schema_error", subject, f"missing or wrong type: {', '.join(missing)}", call_id=stem)
            return None
        call = CallRecord(
            call_id=stem,
            file_sha256=file_sha,
            declared_call_id=receipt["call_id"],
            status=receipt["status"][:32],
            tool=receipt["tool"],
            args=receipt["args"],
        )
        self.optional_receipt_fields(receipt, call, subject)
        self.check_identity(receipt, call, subject)
        self.check_status(call, subject)
        self.storable(call, subject)
        return call

    def optional_receipt_fields(self, receipt: dict[str, Any], call: CallRecord, subject: str) -> None:
        wrong = []
        for name in ("identity", "contract_sha256", "tool_version", "input_sha256", "output_sha256"):
            value = receipt.get(name)
            if value is not None and not isinstance(value, str):
                wrong.append(name)
            else:
                setattr(call, name, value or "")
        attempt = receipt.get("attempt")
        if attempt is not None and not protocol.is_whole_number(attempt):
            wrong.append(f"attempt (a whole number from 0 to {protocol.MAX_INT})")
        elif attempt is not None:
            call.attempt = attempt
        for name in ("result", "error"):
            value = receipt.get(name)
            if value is not None and not isinstance(value, dict):
                wrong.append(name)
            else:
                setattr(call, name, value)
        if isinstance(call.error, dict):
            call.error_kind = _text(call.error.get("kind"))[:32]
        queryable = receipt.get("queryable", False)
        if not isinstance(queryable, bool):
            wrong.append("queryable")
        else:
            call.queryable = queryable
        for name in ("created_at", "updated_at"):
            value = _time_field(receipt, name)
            if value is None and receipt.get(name) is not None:
                wrong.append(name)
            setattr(call, name, value)
        if wrong:
            self.finding("schema_error", subject, f"wrong type: {', '.join(wrong)}", call_id=call.call_id)

    def check_identity(self, receipt: dict[str, Any], call: CallRecord, subject: str) -> None:
        """The protocol's one identity check; each problem it names is a finding."""
        check = protocol.check_receipt_identity(
            receipt, call_id=call.call_id, contract_sha256=self.out.contract_sha256 or None
        )
        call.verification = check.verdict
        call.recomputed_call_id = check.recomputed_call_id
        for code, detail, stored, recomputed in check.problems:
            self.finding(code, subject, detail, call_id=call.call_id, stored_value=stored, recomputed_value=recomputed)

    def check_status(self, call: CallRecord, subject: str) -> None:
        if call.status == protocol.LEGACY_STATUS:
            self.finding(
                "legacy_status", subject, "status 'failed' cannot tell retryable from permanent", call_id=call.call_id
            )
        elif call.status not in protocol.RECEIPT_STATUSES:
            self.finding("invalid_status", subject, f"status {call.status!r}", call_id=call.call_id)

    def read_confirmations(self, dir_fd: int | None) -> dict[str, ConfirmationRecord]:
        found: dict[str, ConfirmationRecord] = {}
        if dir_fd is None:
            return found
        for name in self.json_names(dir_fd, "confirmations"):
            subject = f"confirmations/{name}"
            stem = name[: -len(".json")]
            if len(stem) > MAX_CALL_ID:
                self.finding("unsafe_path", subject, f"file name over {MAX_CALL_ID} characters")
                continue
            parsed = self.read_json(name, dir_fd, subject)
            if parsed is None:
                continue
            document, file_sha = parsed
            record = ConfirmationRecord(call_id=stem, file_sha256=file_sha)
            if isinstance(document, dict):
                record.resolution = _text(document.get("resolution"))
                record.reason = _text(document.get("reason"))
                record.actor = _text(document.get("actor"))
                record.confirmed_at = _time_field(document, "confirmed_at")
                record.receipt_sha256 = _text(document.get("receipt_sha256"))
                record.confirmation_id = _text(document.get("confirmation_id"))
            problem = confirmation_problem(document, stem, self.receipt_shas.get(stem))
            record.valid = problem is None
            record.problem = problem or ""
            if problem is not None:
                self.finding(
                    "confirmation_invalid",
                    subject,
                    problem,
                    call_id=stem,
                    stored_value=record.receipt_sha256[:200],
                    recomputed_value=self.receipt_shas.get(stem, ""),
                )
            self.storable(record, subject)
            found[stem] = record
            self.out.confirmations.append(record)
        return found

    def read_submissions(self, dir_fd: int | None, tasks_fd: int | None) -> None:
        if dir_fd is None:
            return
        seen: set[str] = set()
        for name in self.json_names(dir_fd, "submissions"):
            subject = f"submissions/{name}"
            parsed = self.read_json(name, dir_fd, subject)
            if parsed is None:
                continue
            record, file_sha = parsed
            submission = self.submission_record(record, name, file_sha, subject)
            if submission is None:
                continue
            self.check_task(submission, tasks_fd, subject)
            self.storable(submission, subject)
            # Two ids that differ only where U+0000 stood are one row: the first stays, the other is named.
            if submission.client_submission_id in seen:
                self.finding("unstorable_value", subject, "its client_submission_id, stored, is another record's")
                continue
            seen.add(submission.client_submission_id)
            self.out.submissions.append(submission)

    def submission_record(self, record: Any, name: str, file_sha: str, subject: str) -> SubmissionRecord | None:
        if not isinstance(record, dict):
            self.finding("schema_error", subject, "a submission record must be a JSON object")
            return None
        submission_id = record.get("client_submission_id")
        if not isinstance(submission_id, str) or not 1 <= len(submission_id) <= MAX_SUBMISSION_ID:
            self.finding("schema_error", subject, "client_submission_id must be a string of 1 to 256 characters")
            return None
        key = hashlib.sha256(submission_id.encode("utf-8", "surrogatepass")).hexdigest()
        if name != f"{key}.json":
            self.finding("schema_error", subject, "the file name is not sha256(client_submission_id)")
            return None
        submission = SubmissionRecord(client_submission_id=submission_id, record_key=key, file_sha256=file_sha)
        wrong = []
        for field in ("digest_schema_version", "request_digest", "state", "task_id", "task_path", "task_sha256"):
            value = record.get(field)
            if value is not None and not isinstance(value, str):
                wrong.append(field)
            else:
                setattr(submission, field, value or "")
        submission.state = submission.state[:32]
        request = record.get("request")
        if not isinstance(request, dict):
            wrong.append("request")
        else:
            submission.request = request
        creation = record.get("creation_result")
        if creation is not None and not isinstance(creation, dict):
            wrong.append("creation_result")
        else:
            submission.creation_result = creation
        submission.reserved_at = _time_field(record, "reserved_at")
        submission.updated_at = _time_field(record, "updated_at")
        if submission.state and submission.state not in protocol.SUBMISSION_STATES:
            wrong.append(f"state {submission.state!r}")
        if wrong:
            self.finding("schema_error", subject, f"missing or wrong type: {', '.join(wrong)}")
        if isinstance(request, dict) and submission.digest_schema_version == protocol.DIGEST_SCHEMA:
            submission.recomputed_digest = protocol.request_digest(request)
            if submission.recomputed_digest != submission.request_digest:
                self.finding(
                    "submission_digest_mismatch",
                    subject,
                    "the stored request does not give the stored request_digest",
                    stored_value=submission.request_digest[:200],
                    recomputed_value=submission.recomputed_digest,
                )
        return submission

    def check_task(self, submission: SubmissionRecord, tasks_fd: int | None, subject: str) -> None:
        path = submission.task_path
        if not path:
            return
        folder, _, name = path.partition("/")
        if folder != "tasks" or not name or "/" in name or name in (".", "..") or name.startswith("."):
            self.finding("unsafe_path", subject, f"task_path {path[:200]!r} is not a file in tasks/")
            return
        data = None
        if tasks_fd is not None:
            try:
                data = read_regular(name, tasks_fd, self.limits.max_json_bytes)
            except FileNotFoundError:
                data = None
            except Unsafe as unsafe:
                self.finding(unsafe.code, path, unsafe.detail)
                return
        submission.task_present = data is not None
        if data is not None:
            submission.task_file_sha256 = hashlib.sha256(data).hexdigest()
            expected = submission.task_sha256
            if submission.state == "reserved" and isinstance(submission.request, dict):
                # No digest recorded yet: the writer would adopt only the file it renders itself.
                rendered = render_task(submission.task_id, submission.request, submission.client_submission_id)
                expected = hashlib.sha256(rendered).hexdigest()
            submission.task_matches = submission.task_file_sha256 == expected
        if submission.state in ("task_created", "committed"):
            if data is None:
                self.finding("task_missing", subject, f"{path} is absent but the record is {submission.state}")
            elif submission.task_file_sha256 != submission.task_sha256:
                self.finding(
                    "task_digest_mismatch",
                    subject,
                    f"{path} is not the file the record describes",
                    stored_value=submission.task_sha256[:200],
                    recomputed_value=submission.task_file_sha256,
                )
        if submission.state in ("reserved", "task_created"):
            self.check_stale_reservation(submission, subject)

    def past_stale_age(self, since: dt.datetime | None) -> bool:
        """Whether ``since`` is older than the stale age; if not yet, remember when it will be."""
        if since is None:
            return False
        try:
            stale_at = since + self.limits.stale_after
        except OverflowError:  # a time at the end of the calendar never grows stale
            return False
        if self.now < stale_at:
            if self.out.next_stale_at is None or stale_at < self.out.next_stale_at:
                self.out.next_stale_at = stale_at
            return False
        return True

    def check_stale_reservation(self, submission: SubmissionRecord, subject: str) -> None:
        since = submission.updated_at or submission.reserved_at
        if not self.past_stale_age(since):
            return
        digests = ("yes" if submission.task_matches else "no") if submission.task_present else "n/a"
        self.finding(
            "stale_reservation",
            subject,
            f"state {submission.state} since {protocol.format_time(since)}; task {submission.task_id} "
            f"file present: {'yes' if submission.task_present else 'no'}; digests match: {digests}",
        )

    def cross_check(self, confirmations: dict[str, ConfirmationRecord]) -> None:
        by_id = {call.call_id: call for call in self.out.calls}
        for call_id in sorted(self.ledger_call_ids - self.receipt_files):
            self.finding(
                "missing_receipt", call_id, "the ledger names this call but there is no receipt file", call_id=call_id
            )
            by_id[call_id] = CallRecord(call_id=call_id, receipt_present=False)
            self.out.calls.append(by_id[call_id])
        for call in self.out.calls:
            if call.receipt_present and call.call_id not in self.ledger_call_ids:
                self.finding(
                    "orphan_receipt",
                    f"receipts/{call.call_id}.json",
                    "no ledger event names this call",
                    call_id=call.call_id,
                )
            confirmation = confirmations.get(call.call_id)
            if call.status in ("prepared", "unknown") and not (confirmation is not None and confirmation.valid):
                self.check_stale_call(call)

    def check_stale_call(self, call: CallRecord) -> None:
        since = call.updated_at or call.created_at
        if not self.past_stale_age(since):
            return
        self.finding(
            "stale_call",
            f"receipts/{call.call_id}.json",
            f"{call.status} since {protocol.format_time(since)}, unconfirmed",
            call_id=call.call_id,
        )


def read_run_files(
    run_dir: Path, *, ledger_call_ids: set[str], limits: Limits = DEFAULT_LIMITS, now: dt.datetime | None = None
) -> RunFiles:
    """Everything in a run directory but the ledger, checked against the ledger's call ids."""
    return _RunReader(Path(run_dir), set(ledger_call_ids), limits, now or protocol.utc_now()).read()


def read_run(
    run_dir: Path, *, limits: Limits = DEFAULT_LIMITS, now: dt.datetime | None = None, keep_events: bool = True
) -> tuple[RunFiles, list]:
    """A whole run at once: files and every ledger finding, and the events unless ``keep_events``
    is false (replay needs only the call ids the ledger names, not a million events in memory)."""
    events, ledger_findings = [], []
    cursor = LedgerCursor()
    for batch in read_ledger(Path(run_dir), None, limits):
        if keep_events:
            events.extend(batch.events)
        ledger_findings.extend(batch.findings)
        cursor = batch.cursor
    files = read_run_files(run_dir, ledger_call_ids=cursor.call_ids, limits=limits, now=now)
    files.findings = ledger_findings + files.findings
    return files, events
