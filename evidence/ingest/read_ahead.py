"""A run's files read in a second process while the importer stores what was read.

The reader parses under the GIL, so a thread that reads ahead gains nothing; a child
process does. ``ReadAhead`` starts one (``python -c``, this module's ``child_main``),
hands it what the importer would have passed the reader, and receives the ledger's
batches as the rows the importer stores (``prepare_batch``: the same function the
in-process path calls), then, when asked, the run's other files: their calls as rows, a
batch at a time (``calls_batch``: what the child holds of them, and the importer) with the
findings made meanwhile, then the rest of ``read_run_files``' result.

This module imports no Django: the child loads the reader, replay (for the calls' decisions),
this module and ``evidence.lib.minutes``.

The child never outlives the importer: it dies with it (``PR_SET_PDEATHSIG`` on
Linux; elsewhere at its next write into the closed pipe), and the importer kills it
when it is done with it, whatever the outcome. A child that dies, or says something
the importer cannot read, is a ``ReadAheadError``: the importer carries on reading in
its own process (see ``evidence.ingest.reading``), never waits on a child that is gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import operator
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from evidence.lib.minutes import EPOCH, MINUTE
from receipts.findings import FindingRecord
from receipts.reader.diskset import DiskSet
from receipts.reader.ledger import EventRecord, LedgerBatch, LedgerCursor

UTC = dt.UTC

# --- rows, as both paths make them -----------------------------------------


def json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)


def db_time(value: dt.datetime | None, postgres: bool) -> Any:
    """A datetime as the database takes it: as is for PostgreSQL; for SQLite the
    naive-UTC text Django's own adapter writes (``str`` of the naive value),
    without its per-value connection lookups."""
    if value is None or postgres:
        return value
    if value.tzinfo is not dt.UTC:
        value = value.astimezone(dt.UTC)
    return value.isoformat(" ")[:-6]  # the naive value's str(), without making the naive value: "+00:00" off


@dataclasses.dataclass
class PreparedBatch:
    """One ledger batch as the importer stores it: its event rows (``evidence.ingest.reading.EVENT_COLUMNS``),
    its counts by type and by minute, what the reader found, and the cursor after it."""

    rows: list[tuple[Any, ...]]
    types: Counter[str]
    minutes: Counter[int]
    findings: list[FindingRecord]
    cursor: LedgerCursor
    restarted: bool


def prepare_batch(run_pk: int, batch: LedgerBatch, postgres: bool) -> PreparedBatch:
    events: list[EventRecord] = batch.events
    times: list[Any] = [event.ts for event in events]
    # Comprehensions and Counter's own loop: a million events make each step count.
    minutes = Counter([(ts - EPOCH) // MINUTE for ts in times if ts is not None])
    if not postgres:  # db_time, inlined for the times the reader makes (UTC)
        times = [
            ts.isoformat(" ")[:-6] if ts is not None and ts.tzinfo is UTC else db_time(ts, postgres) for ts in times
        ]
    rows = [
        (
            run_pk,
            event.seq,
            event.line_no,
            ts,
            event.type,
            event.call_id or "",
            event.client_submission_id or "",
            event.disposition or "",
            event.request_digest or "",
            event.line_sha256,
            event.payload,
            event.status,
        )
        for event, ts in zip(events, times, strict=True)
    ]
    return PreparedBatch(rows, Counter(map(_TYPE, events)), minutes, batch.findings, batch.cursor, batch.restarted)


_TYPE = operator.attrgetter("type")


# How a record's value becomes its column's: kept, JSON text, or the database's time.
KEEP, JSON, TIME = "keep", "json", "time"


def record_rows(run_pk: int, records: Sequence[Any], conversions: Sequence[tuple[str, str]], postgres: bool) -> list:
    """Rows ``(run_pk, *values)`` of reader records; ``conversions``: each column's name and
    how its value is converted (chosen once from the model's fields, not guessed per value:
    a hundred thousand receipts have twenty-seven columns each)."""
    pairs = [
        (name, None if how == KEEP else json_text if how == JSON else lambda value: db_time(value, postgres))
        for name, how in conversions
    ]
    return [
        (run_pk, *[values[name] if how is None else how(values[name]) for name, how in pairs])
        for values in map(vars, records)
    ]


# --- the child -------------------------------------------------------------


@dataclasses.dataclass
class Request:
    """What the importer hands a child: ``read_ledger``'s arguments (``cursor`` and on), or
    ``read_run_files``' (``files``; the cursor after the whole ledger comes later, once the
    importer has it): one child reads the ledger, another the other files, at once."""

    run_dir: Path
    run_pk: int
    postgres: bool
    cursor: LedgerCursor | None = None  # where the ledger is read from; None: not read here
    limits: Any = None
    batch_size: int = 0
    signing_key: Any = None
    files: dict[str, Any] | None = None  # read_run_files' keyword arguments but ledger
    decided: dict[str, tuple[str, str]] | None = None
    call_conversions: Sequence[tuple[str, str]] = ()
    calls_batch: int = 0  # how many calls the child reads and sends at a time
    # A SQLite file for the ledger's sets of calls (``DiskSet``), given when the ledger is read from
    # its first byte: the importer removes it once the import is done.
    call_sets: str | None = None


def child_main() -> None:
    """A child's whole life: its request, then (reading the files) the ledger's cursor, in on
    standard input; its answers out on standard output."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the importer decides
    _die_with(int(sys.argv[1]))
    out = os.fdopen(os.dup(1), "wb", buffering=1 << 20)
    os.dup2(2, 1)  # a stray print must not corrupt the answers
    with contextlib.suppress(BrokenPipeError):
        try:
            request: Request = pickle.load(sys.stdin.buffer)  # noqa: S301 - from the importer that started us
            _answer(request, out)
        except BrokenPipeError:
            raise
        except BaseException:  # noqa: BLE001 - the reader never raises; whatever did, the importer hears of it
            pickle.dump(("error", traceback.format_exc()), out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()


def _answer(request: Request, out: Any) -> None:
    from receipts.reader import CallRecord, RunFiles, read_ledger, read_run_files
    from receipts.replay import decide_calls, resolutions_of

    def send(message: tuple[Any, ...]) -> None:
        pickle.dump(message, out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()

    if request.cursor is not None:
        cursor = request.cursor
        if request.call_sets is not None:
            cursor = dataclasses.replace(
                cursor,
                call_ids=DiskSet(request.call_sets, "call_ids"),
                committed_call_ids=DiskSet(request.call_sets, "committed_call_ids"),
                disputed_call_ids=DiskSet(request.call_sets, "disputed_call_ids"),
            )
        read = read_ledger(request.run_dir, cursor, request.limits, request.batch_size, request.signing_key)
        for batch in read:
            cursor = batch.cursor
            prepared = prepare_batch(request.run_pk, batch, request.postgres)
            # The sets of calls grow to the whole ledger's: sent once, at the end, not with every batch.
            prepared.cursor = dataclasses.replace(
                cursor, call_ids=set(), committed_call_ids=set(), disputed_call_ids=set(), submission_digests={}
            )
            send(("batch", prepared))
        send(("ledger_end", cursor))  # sets on disk go as their file: written to it as they are pickled
    if request.files is None:
        return
    ledger: list[LedgerCursor] = []

    def whole_ledger() -> LedgerCursor:
        if not ledger:
            ledger.append(pickle.load(sys.stdin.buffer))  # noqa: S301 - from the importer that started us
        return ledger[0]

    resolutions: list[dict[str, str]] = []

    def send_calls(calls: list[CallRecord], files: RunFiles) -> None:
        if not resolutions:  # the confirmations are read before the first batch comes
            resolutions.append(resolutions_of(files.confirmations))
        decide_calls(calls, resolutions[0], decided=request.decided)
        findings, files.findings = files.findings, []  # handed over with the batch, not held to the end
        send(("calls", record_rows(request.run_pk, calls, request.call_conversions, request.postgres), findings))

    files = read_run_files(
        request.run_dir, ledger=whole_ledger, sink=send_calls, calls_batch=request.calls_batch, **request.files
    )
    whole_ledger()  # the importer sends it whether the reader needed it or not
    send(("files", files))


def _die_with(parent: int) -> None:
    """Be killed when the importer dies, however it dies (Linux); elsewhere a closed pipe ends us."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)  # the importer died before the line above took effect


# --- the importer's side ---------------------------------------------------


# Where the child finds this very module (evidence/ingest/read_ahead.py), whatever its working
# directory and sys.path: not another copy of the project installed beside it.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class ReadAheadError(Exception):
    """The child died or said something that is not an answer: read in this process instead."""


class ReadAhead:
    """One child reading one run for the importer. Use as a context manager: the child is
    killed and reaped on the way out, whatever happened."""

    def __init__(self, request: Request) -> None:
        self.ledger_done = False
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the child, in close()
        root = str(PROJECT_ROOT)
        boot = (
            f"import sys; sys.path.insert(0, {root!r}); from evidence.ingest.read_ahead import child_main; child_main()"
        )
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", boot, str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.stderr,
                close_fds=True,
            )
        except OSError as error:
            self.stderr.close()
            raise ReadAheadError(f"the reading process could not be started: {error}") from None
        assert self.process.stdin is not None and self.process.stdout is not None
        self.answers = self.process.stdout
        self.requests = self.process.stdin
        try:
            self._send(request)
        except ReadAheadError:
            self.close()
            raise
        if request.files is None:
            self.requests.close()

    def _send(self, message: Any) -> None:
        try:
            pickle.dump(message, self.requests, protocol=pickle.HIGHEST_PROTOCOL)
            self.requests.flush()
        except (OSError, ValueError) as error:
            raise ReadAheadError(self._why(f"could not be told ({type(error).__name__})")) from None

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def pid(self) -> int:
        return self.process.pid

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        with contextlib.suppress(OSError):  # a pipe with unsent bytes, into a child now gone
            self.requests.close()
        self.answers.close()
        self.stderr.close()

    def _receive(self) -> tuple[Any, ...]:
        try:
            message = pickle.load(self.answers)  # noqa: S301 - our own child, over a pipe only it holds
        except Exception as error:  # noqa: BLE001 - a short or garbled answer: the child is gone or broken
            raise ReadAheadError(self._why(f"stopped answering ({type(error).__name__})")) from None
        if not isinstance(message, tuple) or not message:
            raise ReadAheadError(self._why("answered nonsense"))
        if message[0] == "error":
            last = str(message[1]).strip().splitlines() or ["no detail"]
            raise ReadAheadError(f"the reading process failed: {last[-1][:300]}")
        return message

    def _why(self, what: str) -> str:
        code = self.process.poll()
        if code is None:
            self.process.kill()
            code = self.process.wait()
        status = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        with contextlib.suppress(OSError, ValueError):
            self.stderr.seek(0)
            last = self.stderr.read().decode("utf-8", "replace").strip().splitlines()
            if last:
                status += f": {last[-1][:300]}"
        return f"the reading process {what} ({status})"

    def batches(self) -> Iterator[PreparedBatch]:
        """The ledger's batches, prepared; then ``final_cursor`` holds the cursor after the last,
        with its sets of calls."""
        while True:
            message = self._receive()
            if message[0] == "ledger_end":
                self.final_cursor: LedgerCursor = message[1]
                self.ledger_done = True
                return
            if message[0] != "batch":
                raise ReadAheadError(self._why(f"answered {str(message[0])[:40]!r} for a batch"))
            yield message[1]

    def files(self, cursor: LedgerCursor) -> Iterator[tuple[list[tuple[Any, ...]], list[FindingRecord]]]:
        """The other files, given the cursor after the whole ledger (as read in either process):
        their calls' rows (``record_rows``), decisions applied, a batch at a time, each with the
        findings made since the last; then ``files_read`` holds the rest (``read_run_files``'
        result, with no calls, and the findings made after the last batch)."""
        self._send(cursor)
        with contextlib.suppress(OSError):
            self.requests.close()
        while True:
            message = self._receive()
            if message[0] == "files":
                self.files_read: Any = message[1]
                return
            if message[0] != "calls":
                raise ReadAheadError(self._why(f"answered {str(message[0])[:40]!r} for the files"))
            yield message[1], message[2]
