"""The event ledger, streamed from a cursor in batches and checked line by line.

A re-import parses only the appended lines: the cursor carries how far the
ledger was read, a digest of that prefix (a changed prefix is a rewritten
ledger), and what the next lines are judged against.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import os
from collections.abc import Iterator, MutableSet
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.confined import UnsafePath, open_folder, open_regular
from receipts.findings import LEDGER as LEDGER_SCOPE
from receipts.findings import STICKY, FindingRecord, Sentence, storable_text
from receipts.protocol import LEDGER_NAME as LEDGER
from receipts.reader.diskset import DiskSet
from receipts.reader.safe_open import DEFAULT_LIMITS, Limits

_KNOWN_STATUSES = frozenset((*protocol.RECEIPT_STATUSES, protocol.LEGACY_STATUS))
# Events stored and committed together with the cursor after them: fewer commits, and at
# most this many events (about 30 MiB) held at once.
BATCH_EVENTS = 50_000
# How far a line's ts may be before the line before it with no finding. The writer takes ts
# under the ledger's lock, so lines go back only when the clock does; a time service's own
# step corrections are a fraction of a second, a clock set back (by a person, a wrong server)
# is more: ``ledger_clock_back``, a warning.
CLOCK_BACK_TOLERANCE = dt.timedelta(seconds=1)

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
    # Sets in memory, or on disk (``DiskSet``) when the importer reads a run in child processes.
    call_ids: MutableSet[str] = dataclasses.field(default_factory=set)
    # Calls whose commit the ledger records (a receipt event with status committed), and calls
    # whose last reuse the writer refused because the target did not show the effect.
    committed_call_ids: MutableSet[str] = dataclasses.field(default_factory=set)
    disputed_call_ids: MutableSet[str] = dataclasses.field(default_factory=set)
    submission_digests: dict[str, str] = dataclasses.field(default_factory=dict)
    first_ts: dt.datetime | None = None
    last_ts: dt.datetime | None = None
    # The ts of the line before ``offset`` (None: it has none, or there is none). Not kept by the
    # importer: a read that starts past the first line reads it back from the file.
    previous_ts: dt.datetime | None = None


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
    status: str | None = None  # a receipt event's status


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
    run_dir: Path,
    cursor: LedgerCursor | None = None,
    limits: Limits = DEFAULT_LIMITS,
    batch_size: int = BATCH_EVENTS,
    signing_key: protocol.SigningKey | None = None,
) -> Iterator[LedgerBatch]:
    """Stream the ledger from ``cursor`` in batches of at most ``batch_size`` events.

    ``signing_key``: the key of a signed run; every line must carry a signature
    that verifies with it (``signature_missing``, ``signature_invalid``).

    A changed prefix yields a sticky ``ledger_rewritten`` finding and the
    ledger is read again from the start (``restarted`` on the first batch). A
    last line without its newline is a write in progress: not read, no finding.
    """
    cursor = dataclasses.replace(cursor or LedgerCursor())
    # The caller's sets are not changed, but sets on disk, which the caller hands over to be filled.
    if not isinstance(cursor.call_ids, DiskSet):
        cursor.call_ids = set(cursor.call_ids)
        cursor.committed_call_ids = set(cursor.committed_call_ids)
        cursor.disputed_call_ids = set(cursor.disputed_call_ids)
    cursor.submission_digests = dict(cursor.submission_digests)
    try:
        run_fd = open_folder(run_dir)
    except (UnsafePath, OSError) as error:
        said = error.detail if isinstance(error, UnsafePath) else Sentence("unsafe_path.os_error", error=error)
        yield LedgerBatch([], [FindingRecord("unsafe_path", str(run_dir), said)], cursor)
        return
    try:
        try:
            fd, info = open_regular(LEDGER, run_fd)
        except FileNotFoundError:
            yield LedgerBatch([], [], cursor)
            return
        except UnsafePath as unsafe:
            yield LedgerBatch([], [FindingRecord(unsafe.code, LEDGER, unsafe.detail)], cursor)
            return
        try:
            yield from _read_ledger_fd(fd, info.st_size, cursor, limits, batch_size, signing_key)
        finally:
            os.close(fd)
    finally:
        os.close(run_fd)


def _read_ledger_fd(
    fd: int, size: int, cursor: LedgerCursor, limits: Limits, batch_size: int, signing_key: protocol.SigningKey | None
) -> Iterator[LedgerBatch]:
    restarted = False
    findings: list[FindingRecord] = []
    digest = _hash_prefix(fd, cursor.offset)
    if cursor.offset and (size < cursor.offset or digest.hexdigest() != cursor.prefix_sha256):
        findings.append(
            FindingRecord(
                "ledger_rewritten",
                LEDGER,
                Sentence("ledger_rewritten.changed", offset=cursor.offset),
                stored_value=cursor.prefix_sha256,
                recomputed_value=digest.hexdigest() if size >= cursor.offset else f"the file is {size} bytes now",
                scope=STICKY,
            )
        )
        for calls in (cursor.call_ids, cursor.committed_call_ids, cursor.disputed_call_ids):
            calls.clear()  # emptied in place: sets on disk stay on disk
        cursor = LedgerCursor(
            call_ids=cursor.call_ids,
            committed_call_ids=cursor.committed_call_ids,
            disputed_call_ids=cursor.disputed_call_ids,
        )
        digest = hashlib.sha256()
        restarted = True
    cursor.previous_ts = _line_ts_before(fd, cursor.offset, limits.max_line_bytes)

    events: list[EventRecord] = []
    with os.fdopen(os.dup(fd), "rb", buffering=1 << 20) as stream:
        stream.seek(cursor.offset)
        max_line = limits.max_line_bytes
        while line := stream.readline(max_line + 1):
            if line[-1:] == b"\n":
                digest.update(line)
                cursor.offset += len(line)
                _take_line(line[:-1], cursor, events, findings, signing_key)
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
    cursor.previous_ts = None
    findings.append(
        _ledger_finding(
            "oversize", cursor.line_no, Sentence("oversize.line", length=length - 1, limit=limits.max_line_bytes)
        )
    )
    return trial


def _take_line(
    body: bytes,
    cursor: LedgerCursor,
    events: list[EventRecord],
    findings: list[FindingRecord],
    signing_key: protocol.SigningKey | None = None,
) -> None:
    """Check one complete ledger line (without its newline); the cursor moves past it.

    The hot path of an import: one call per event, so the common case does as
    little as it can and the rare ones call out.
    """
    cursor.line_no = line_no = cursor.line_no + 1
    previous_ts, cursor.previous_ts = cursor.previous_ts, None  # this line's, once it has one
    previous_line_sha = cursor.last_line_sha256
    cursor.last_line_sha256 = line_sha = hashlib.sha256(body).hexdigest()
    try:
        text = protocol.decode_utf8(body)  # decoded once: the event keeps the text
        event = protocol.load_json_text(text)
    except ValueError as error:
        findings.append(_ledger_finding("invalid_json", line_no, Sentence("invalid_json.parse", error=error)))
        return
    if type(event) is not dict:
        findings.append(_ledger_finding("schema_error", line_no, Sentence("schema_error.event_not_object")))
        return
    get = event.get
    seq, event_type = get("seq"), get("type")
    if not protocol.is_whole_number(seq, minimum=1) or type(event_type) is not str:
        findings.append(
            _ledger_finding("schema_error", line_no, Sentence("schema_error.event_seq", max=protocol.MAX_INT))
        )
        return
    trusted = True
    if signing_key is not None and (wrong := protocol.signature_problem(event, signing_key)) is not None:
        findings.append(
            _ledger_finding(wrong[0], line_no, Sentence("ledger_line.signature", seq=seq, problem=wrong[1]))
        )
        trusted = False
    prev = get("prev_sha256")
    if prev is None and cursor.chained:
        findings.append(
            _ledger_finding(
                "ledger_chain_broken",
                line_no,
                Sentence("ledger_chain_broken.no_prev", seq=seq),
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
                    Sentence("ledger_chain_broken.prev", seq=seq),
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
    ts: dt.datetime | None
    try:
        ts = protocol.parse_time(get("ts"))
    except (ValueError, TypeError):
        ts = None
        findings.append(_ledger_finding("schema_error", line_no, Sentence("schema_error.event_ts", seq=seq)))
    else:
        cursor.previous_ts = ts
        if previous_ts is not None and ts < previous_ts - CLOCK_BACK_TOLERANCE:
            _clock_back_finding(seq, line_no, ts, previous_ts, findings)
        if cursor.first_ts is None or ts < cursor.first_ts:
            cursor.first_ts = ts
        if cursor.last_ts is None or ts > cursor.last_ts:
            cursor.last_ts = ts
    call_id = get("call_id")
    if call_id is not None:
        call_id = call_id if protocol.valid_call_name(call_id) else None
        if call_id is None:
            findings.append(_ledger_finding("schema_error", line_no, Sentence("schema_error.event_call_id", seq=seq)))
        else:
            cursor.call_ids.add(call_id)
    submission_id = disposition = request_digest = status = None
    if call_id is not None and trusted:  # a line nobody with the key wrote moves no verdict
        if event_type == "receipt":
            status = get("status")
            status = status if type(status) is str and status in _KNOWN_STATUSES else None
            if status == "committed":
                cursor.committed_call_ids.add(call_id)
        elif event_type == "reuse_refused":
            cursor.disputed_call_ids.add(call_id)
        elif event_type == "call_reused":
            cursor.disputed_call_ids.discard(call_id)
    if event_type == "submission":
        submission_id = _short_text(get("client_submission_id"), protocol.MAX_SUBMISSION_ID_LENGTH)
        disposition = get("disposition") if get("disposition") in protocol.DISPOSITIONS else None
        request_digest = _short_text(get("request_digest"), 64)
    event_type = event_type[:64]
    if b"\\u0000" in body:  # rare: only an escape can put U+0000 in a string
        event_type, (call_id, submission_id, request_digest) = _storable_event_fields(
            line_no,
            findings,
            event_type,
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
            text,
            status,
        )
    )


def _clock_back_finding(
    seq: int, line_no: int, ts: dt.datetime, previous_ts: dt.datetime, findings: list[FindingRecord]
) -> None:
    back = round((previous_ts - ts).total_seconds(), 6)
    said = Sentence(
        "ledger_clock_back.earlier",
        seq=seq,
        ts=protocol.format_time(ts),
        seconds=f"{back:g}",
        before=protocol.format_time(previous_ts),
    )
    findings.append(_ledger_finding("ledger_clock_back", line_no, said))


def _line_ts_before(fd: int, offset: int, max_line: int) -> dt.datetime | None:
    """The ts of the complete line that ends at ``offset``, as ``_take_line`` reads it (``None``
    for a line it takes no time from: not JSON, not an event, too long, or no line at all)."""
    if offset <= 0:
        return None
    try:
        end, tail = offset - 1, b""  # the byte at ``end`` is the line's newline
        while True:
            start = max(0, end - len(tail) - 4096)
            chunk = os.pread(fd, end - len(tail) - start, start)
            if len(chunk) != end - len(tail) - start:
                return None  # the file is shorter than the cursor says: its prefix check says so
            tail = chunk + tail
            newline = tail.rfind(b"\n")
            if newline >= 0 or start == 0:
                body = tail[newline + 1 :]
                break
            if len(tail) > max_line:
                return None
        if len(body) > max_line:
            return None
        event = protocol.load_json_text(protocol.decode_utf8(body))
        if type(event) is not dict or not protocol.is_whole_number(event.get("seq"), minimum=1):
            return None
        if type(event.get("type")) is not str:
            return None
        return protocol.parse_time(event.get("ts"))
    except (OSError, ValueError, TypeError):
        return None


def _storable_event_fields(
    line_no: int, findings: list[FindingRecord], event_type: str, **values: str | None
) -> tuple[str, list[str | None]]:
    """The event's type and the other ``values`` as a database can hold them, in order."""
    changed = [name for name, value in {"type": event_type, **values}.items() if value and "\x00" in value]
    if changed:
        findings.append(
            _ledger_finding(
                "unstorable_value",
                line_no,
                Sentence("unstorable_value.event", fields=", ".join(changed)),
            )
        )
    return storable_text(event_type), [storable_text(value) if value else value for value in values.values()]


# A hostile ledger may repeat a huge line many times: each finding keeps at most this much of it.
MAX_EVIDENCE_CHARS = 64 * 1024


def _seq_finding(seq: int, last_seq: int, line_no: int, body: bytes, findings: list[FindingRecord]) -> None:
    if seq <= last_seq:
        text = body.decode("utf-8")
        kept = (
            Sentence("ledger_seq_duplicate.whole", seq=seq, last=last_seq)
            if len(text) <= MAX_EVIDENCE_CHARS
            else Sentence("ledger_seq_duplicate.first", seq=seq, last=last_seq, chars=MAX_EVIDENCE_CHARS)
        )
        findings.append(
            _ledger_finding(
                "ledger_seq_duplicate",
                line_no,
                kept,
                recomputed_value=hashlib.sha256(body).hexdigest(),
                evidence=text[:MAX_EVIDENCE_CHARS],
            )
        )
    else:
        findings.append(
            _ledger_finding("ledger_seq_gap", line_no, Sentence("ledger_seq_gap.due", seq=seq, due=last_seq + 1))
        )


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
    # One problem, one finding: a conflict disposition and a second digest for the same id (the
    # writer refuses the second request, so one event often says both) are one row, named by the
    # id. Its detail names the newest event, so a new one for the same id changes it.
    conflict = disposition == "conflict"
    first = None if digest is None else cursor.submission_digests.setdefault(submission_id, digest)
    second = digest if first is not None and first != digest else None
    if conflict or second:
        reason = str(event.get("reason"))[:200]
        said = (
            Sentence("submission_conflict.both", seq=seq, reason=reason)
            if conflict and second
            else Sentence("submission_conflict.disposition", seq=seq, reason=reason)
            if conflict
            else Sentence("submission_conflict.digests", seq=seq)
        )
        findings.append(
            FindingRecord(
                "submission_conflict",
                f"submission {submission_id}",
                said,
                stored_value=(first or "") if second else "",
                recomputed_value=second or "",
                scope=LEDGER_SCOPE,
            )
        )
