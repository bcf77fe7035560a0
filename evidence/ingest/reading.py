"""How is a run read? Its ledger from where the last import stopped, batch by batch, each
batch committed together with the cursor that follows it; in child processes when there is
enough to read.

``import_ledger`` stores the ledger's new lines: a killed import leaves committed batches
that the next one builds on. ``Ahead`` starts the children that read ahead
(``evidence.ingest.read_ahead``): one reads the ledger while this process stores it, another
the other files meanwhile, when the import reads them all with none known. When a child
fails, the rest is read in this process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.db import transaction

from evidence.ingest import read_ahead
from evidence.ingest.crosschecks import signing_keys
from evidence.ingest.read_ahead import PreparedBatch, ReadAhead, ReadAheadError
from evidence.ingest.storing import CALL_FIELDS, bulk_upsert, conversions, is_postgres, store_findings
from evidence.lib import stats
from evidence.models import Call, Event, Run
from receipts import protocol
from receipts.findings import FILES, LEDGER, FindingRecord
from receipts.reader import LedgerCursor, Limits, diskset, read_ledger
from receipts.reader.files import run_signing_key
from receipts.reader.safe_open import signature_from

log = logging.getLogger("callproof.importer")

Progress = Callable[[str, int, int], None]  # run_id, ledger bytes read, ledger size


# --- the ledger ------------------------------------------------------------

EVENT_COLUMNS = (
    "run_id",
    "seq",
    "line_no",
    "ts",
    "type",
    "call_id",
    "client_submission_id",
    "disposition",
    "request_digest",
    "line_sha256",
    "payload",
    "status",
)


# Run column <-> LedgerCursor field: the cursor is stored with each batch and read back from these.
CURSOR_COLUMNS = (
    ("ledger_offset", "offset"),
    ("ledger_prefix_sha256", "prefix_sha256"),
    ("ledger_last_seq", "last_seq"),
    ("ledger_last_line_sha256", "last_line_sha256"),
    ("ledger_line_no", "line_no"),
    ("ledger_chained", "chained"),
    ("first_event_at", "first_ts"),
    ("last_event_at", "last_ts"),
)


def _cursor_of(run: Run) -> LedgerCursor:
    """Where the last import stopped, and the submissions' first digests (the ledger's reader
    checks each new line against them). The sets of calls start empty: after the read they
    name the calls of the new lines only, unless the whole ledger was read (``import_ledger``)."""
    cursor = LedgerCursor(**{field: getattr(run, column) for column, field in CURSOR_COLUMNS})
    if run.ledger_offset:
        events = Event.objects.filter(run=run)
        submissions = events.filter(type="submission", client_submission_id__gt="").exclude(request_digest="")
        for submission_id, digest in submissions.order_by("seq").values_list("client_submission_id", "request_digest"):
            cursor.submission_digests.setdefault(submission_id, digest)
    return cursor


# --- reading ahead, in children --------------------------------------------

# A child reads ahead (``evidence.ingest.read_ahead``) when there is this much to read: below it,
# starting a process costs about what it would save.
READ_AHEAD_LEDGER_BYTES = 16 << 20  # some 35,000 events
READ_AHEAD_RECEIPTS = 10_000


# What the files' child is not handed of read_run_files' arguments: the run directory goes
# apart, and the listing's signatures (a million receipts' make some 250 MB, pickled and held
# again in the child) are taken by the child itself, a stat before each file is read: a file
# changed since the listing shows on the next import either way, by its signature or the run's.
NOT_FOR_THE_CHILD = ("run_dir", "listed_signatures")


@dataclasses.dataclass
class Ahead:
    """The children that read a run for one import, when they are worth starting: one reads
    the ledger while this process stores it; another the other files meanwhile, when this
    import reads them all with none known. ``stack`` kills and reaps them when it closes."""

    stack: contextlib.ExitStack
    run: Run
    file_arguments: dict[str, Any] | None  # read_run_files' arguments, when the files are read ahead
    decided: dict[str, tuple[str, str]]
    calls_batch: int  # how many calls the files' child reads and sends at a time
    # Holds the file where a child reading the whole ledger keeps its sets of calls (``calls_on_disk``),
    # made only then, and kept until the import is done with them; None: the sets stay in memory.
    call_sets: contextlib.ExitStack | None = None
    files_child: ReadAhead | None = None

    def _start(self, request: read_ahead.Request) -> ReadAhead | None:
        try:
            return self.stack.enter_context(ReadAhead(request))
        except ReadAheadError as failure:
            read_here(self.run.run_id, failure)
            return None

    def start_files(self, receipts: int) -> None:
        if self.file_arguments is None or receipts < READ_AHEAD_RECEIPTS:
            return
        self.files_child = self._start(
            read_ahead.Request(
                Path(self.file_arguments["run_dir"]), self.run.pk, is_postgres(),
                files={name: value for name, value in self.file_arguments.items() if name not in NOT_FOR_THE_CHILD},
                decided=self.decided, call_conversions=conversions(Call, CALL_FIELDS), calls_batch=self.calls_batch,
            )
        )  # fmt: skip

    def start_ledger(
        self,
        path: Path,
        cursor: LedgerCursor,
        limits: Limits,
        batch_size: int,
        signing_key: protocol.SigningKey | None,
        ledger_size: int,
    ) -> ReadAhead | None:
        if ledger_size - self.run.ledger_offset < READ_AHEAD_LEDGER_BYTES:
            return None
        on_disk = None
        if cursor.offset == 0 and self.call_sets is not None:  # the whole ledger's calls: as many as the run's
            on_disk = self.call_sets.enter_context(calls_on_disk())
        request = read_ahead.Request(
            path, self.run.pk, is_postgres(), cursor, limits, batch_size, signing_key, call_sets=on_disk
        )
        return self._start(request)


CALLS_FOLDER_PREFIX = "callproof-calls-"
CALLS_FOLDER_OWNER = "owner.lock"
# A folder with no lock in it is being made this instant, or was left by a version that locked
# none: it is removed only once this old.
UNLOCKED_CALLS_FOLDER_AGE = dt.timedelta(minutes=10)


@contextlib.contextmanager
def calls_on_disk() -> Iterator[str]:
    """A SQLite file in a new temporary folder, for one import's sets of calls (``DiskSet``):
    closed in this process and removed with its folder on the way out.

    The folder holds a lock file this process keeps locked (``flock``) until the folder is gone:
    the kernel lets go of it when the process dies, however it dies, and that is how
    ``sweep_calls_folders`` tells a killed importer's folder from a live one's."""
    folder = tempfile.mkdtemp(prefix=CALLS_FOLDER_PREFIX)
    try:
        with open(os.path.join(folder, CALLS_FOLDER_OWNER), "wb") as owner:
            fcntl.flock(owner, fcntl.LOCK_EX)
            path = os.path.join(folder, "calls.sqlite3")
            try:
                yield path
            finally:
                diskset.release(path)
                shutil.rmtree(folder, ignore_errors=True)  # still locked: no sweep is removing it too
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def sweep_calls_folders(now: dt.datetime | None = None) -> list[str]:
    """Remove the calls folders (``calls_on_disk``) that importers killed before the end left in
    the temporary directory; returns their paths. Only this user's folders, never through a
    symlink; a folder whose lock is held belongs to an importer still at work and is left."""
    now = now or dt.datetime.now(dt.UTC)
    removed: list[str] = []
    try:
        entries = list(os.scandir(tempfile.gettempdir()))
    except OSError:
        return removed
    for entry in entries:
        try:
            if not entry.name.startswith(CALLS_FOLDER_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_uid != os.geteuid():
                continue
            if _left_behind(entry.path, now):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
        except OSError:  # gone meanwhile, or not ours to read: another sweep's, or nobody's business
            continue
    if removed:
        log.info("removed calls folders killed importers left", extra={"event": "calls_folders_swept",
                 "detail": ", ".join(removed)[:2000]})  # fmt: skip
    return removed


def _left_behind(folder: str, now: dt.datetime) -> bool:
    try:
        # O_NOFOLLOW: a symlink put in a folder's place of its lock is not opened.
        descriptor = os.open(os.path.join(folder, CALLS_FOLDER_OWNER), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        modified = dt.datetime.fromtimestamp(os.stat(folder, follow_symlinks=False).st_mtime, dt.UTC)
        return now - modified > UNLOCKED_CALLS_FOLDER_AGE
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # its importer holds it
    finally:
        os.close(descriptor)  # the lock, when taken, goes with it
    return True


def read_here(run_id: str, failure: Exception) -> None:
    log.warning(
        "reading in this process instead",
        extra={"event": "read_ahead_failed", "run_id": run_id, "detail": str(failure)[:2000]},
    )


def import_ledger(
    run: Run,
    path: Path,
    limits: Limits,
    now: dt.datetime,
    progress: Progress | None,
    batch_size: int,
    ahead: Ahead | None = None,
) -> tuple[LedgerCursor, list[FindingRecord], bool]:
    """Store the ledger's new lines batch by batch; returns the cursor, the findings about
    the ledger file itself (a FIFO or symlink in its place), which are re-checked on every
    import like the other files' findings, and whether the ledger was read from its first
    byte (then the cursor's sets of calls are the whole ledger's, else the new lines').

    ``ahead``: when there is enough to read, a child reads the ledger from the same cursor
    while this process stores (``Ahead.start_ledger``). When it fails, the batches it gave stay
    stored, each whole with its cursor, and the rest is read here, as the next import would
    after a killed one."""
    cursor = _cursor_of(run)
    whole = run.ledger_offset == 0
    file_findings: list[FindingRecord] = []
    postgres = is_postgres()
    try:
        ledger = os.lstat(path / protocol.LEDGER_NAME)
    except OSError:
        ledger = None
    ledger_size = ledger.st_size if ledger else 0
    signature = signature_from(ledger) if ledger else ""
    if signature and signature == run.ledger_signature and not _ledger_has_file_findings(run):
        return cursor, file_findings, whole  # not a byte added or changed since it was read to its end
    signing_key = run_signing_key(path, signing_keys())
    child = ahead.start_ledger(path, cursor, limits, batch_size, signing_key, ledger_size) if ahead else None
    if child is not None:
        batches: Iterator[PreparedBatch] = child.batches()
    else:
        read = read_ledger(path, cursor, limits, batch_size, signing_key)
        batches = (read_ahead.prepare_batch(run.pk, batch, postgres) for batch in read)
    try:
        for batch in batches:
            with transaction.atomic():
                if batch.restarted:
                    whole = True
                    Event.objects.filter(run=run).delete()
                    run.findings.filter(scope=LEDGER, closed_at__isnull=True).update(closed_at=now)
                bulk_upsert(Event, EVENT_COLUMNS, batch.rows, conflict=("run_id", "seq"), update=False)
                stats.count_batch(run, batch.types, batch.minutes, restarted=batch.restarted)
                store_findings(run, batch.findings, now)
                file_findings.extend(f for f in batch.findings if f.scope == FILES)
                cursor = batch.cursor
                Run.objects.filter(pk=run.pk).update(
                    **{column: getattr(cursor, field) for column, field in CURSOR_COLUMNS}
                )
            if progress is not None:
                progress(run.run_id, cursor.offset, ledger_size)
    except ReadAheadError as failure:
        read_here(run.run_id, failure)
        run.refresh_from_db()
        cursor, rest_findings, rest_whole = import_ledger(run, path, limits, now, progress, batch_size)
        return cursor, file_findings + rest_findings, rest_whole
    if child is not None:
        cursor = child.final_cursor  # the batches' cursors leave out the sets of calls
    # Taken before the read: a line appended meanwhile changes it, and is read next time.
    Run.objects.filter(pk=run.pk).update(ledger_signature=signature)
    return cursor, file_findings, whole


def _ledger_has_file_findings(run: Run) -> bool:
    """A ledger that could not be read as a file (its finding is re-checked by reading it)."""
    ledger_findings = run.findings.filter(closed_at__isnull=True, scope=FILES, subject__startswith=protocol.LEDGER_NAME)
    return ledger_findings.exists()
