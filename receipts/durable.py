"""How the writer puts bytes on disk: whole, durable, atomic, and in order.

Standard library only, like ``protocol``. Every write loops until its last
byte (``write_all``); files are replaced atomically (``write_durable``) or
created once (``create_durable``); the ledger is appended under a lock
(``append_event``), each line signed in a signed run (``receipts.signing``,
which reads the run's key id through the confined open, not through this
module). Below a run directory every folder and file is reached through the
confined open (``receipts.confined``, its write mode): no symlink followed,
only regular files opened. The failpoints named in the interface docs end the
process here, as if it had been killed, when ``RECEIPTS_FAILPOINT`` names them.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from receipts.confined import UnsafePath, folder, folder_of, open_file, open_in
from receipts.protocol import (
    LEDGER_NAME,
    MAX_INT,
    WRITER_DIR,
    ZERO_HASH,
    canonical_json,
    format_time,
    load_json_strict,
    sha256_hex,
    signed,
    utc_now,
)
from receipts.signing import key_for_run


class RecordingIncomplete(Exception):  # noqa: N818 - an outcome: the effect is done
    """The effect is done, but the writer could not record all of it.

    ``outcome`` is what the caller would have been told (a ``CallOutcome`` or a
    ``TaskResult``). The caller must not run the effect again as a new request:
    the same call (or submission) again completes the record instead.
    """

    def __init__(self, outcome: Any, cause: BaseException) -> None:
        super().__init__(f"done, but recording it is incomplete: {cause}")
        self.outcome = outcome
        self.cause = cause


@contextlib.contextmanager
def recording(outcome: Any) -> Iterator[None]:
    """The effect behind ``outcome`` is done: a failure to record it now raises
    ``RecordingIncomplete`` (exit 5), never an error that reads as "nothing happened"."""
    try:
        yield
    except (OSError, ValueError) as error:
        raise RecordingIncomplete(outcome, error) from error


# The lock every append of the ledger takes, in the writer's own folder.
LEDGER_LOCK = "ledger.lock"
_failpoint_hits: dict[str, int] = {}  # how often each failpoint was reached (``NAME@N``)


def failpoint(name: str) -> None:
    """End the process as if killed, when a crash test asks for it here (tests and demos only).

    ``NAME:stop`` stops the process there instead (SIGSTOP), for a harness to SIGKILL it:
    a real kill, at a window somebody chose (``receipts.crashes.kill_at_failpoint``).
    ``NAME:pause`` stops it there and, once continued (SIGCONT), goes on: for a test to change
    the world between two steps (a legal hold set while retention archives). ``NAME@N`` ends
    it the N-th time it gets there (a shipper killed after its third push, not its first).
    """
    wanted = os.environ.get("RECEIPTS_FAILPOINT")
    if not wanted:
        return
    if wanted == name:
        os._exit(137)
    if wanted.startswith(f"{name}@"):
        _failpoint_hits[name] = hits = _failpoint_hits.get(name, 0) + 1
        if wanted == f"{name}@{hits}":
            os._exit(137)
    # Sent to this thread, not the process: a SIGSTOP sent to the process by one of its threads
    # (the writer daemon serves each client in its own) can let that thread run on to the next
    # line before the stop takes it, and the daemon ended where it was to wait for its kill.
    if wanted == f"{name}:stop":
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        os._exit(137)  # continued rather than killed: end as the kill would have
    if wanted == f"{name}:pause":
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


def json_file(value: Any) -> bytes:
    """A record file's bytes: indented, sorted, UTF-8, one trailing newline."""
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, allow_nan=False).encode() + b"\n"


def fsync_directory(directory: Path, root: Path | None) -> None:
    with folder(directory, root, create=False) as dir_fd:
        os.fsync(dir_fd)


def temp_name_for(name: str) -> str:
    """A fresh temp name beside ``name`` that readers ignore (leading dot, ``.tmp``)."""
    return f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"


# What temp_name_for makes: ".<name>.<pid>.<8 hex>.tmp". Only such names are ever swept.
TEMP_NAME_RE = re.compile(r"\..+\.[0-9]+\.[0-9a-f]{8}\.tmp", re.DOTALL)


def is_temp_name(name: str) -> bool:
    return TEMP_NAME_RE.fullmatch(name) is not None


def temp_files_of(path: Path, root: Path | None) -> list[Path]:
    """The temp files beside ``path`` (``[]`` when its folder is missing)."""
    prefix = f".{Path(path).name}."
    try:
        with folder_of(path, root, create=False) as (dir_fd, _):
            names = [entry.name for entry in os.scandir(dir_fd)]
    except FileNotFoundError:
        return []
    return sorted(Path(path).with_name(name) for name in names if name.startswith(prefix) and is_temp_name(name))


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


def _write_temp(dir_fd: int, name: str, data: bytes) -> str:
    temp = temp_name_for(name)
    fd = open_in(dir_fd, temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)  # a new name: nothing there to follow
    try:
        write_all(fd, data)
        # An fsync error is fatal: the caller never gets to call this durable.
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise
    os.close(fd)
    return temp


def write_durable(
    path: Path, data: bytes, before_replace: Callable[[], None] | None = None, *, root: Path | None
) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    Temp file in the same directory (exclusive create), write, fsync, rename
    onto the final name, fsync the directory. ``before_replace`` runs between
    the temp file and the rename (a failpoint lives there). Below ``root``, the
    folders are entered without following a symlink; a rename replaces a
    symlink at the final name, never writes through it.
    """
    with folder_of(path, root) as (dir_fd, name):
        temp = _write_temp(dir_fd, name, data)
        if before_replace is not None:
            before_replace()
        try:
            os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)


def replace_durable(temp: Path, path: Path, *, root: Path | None) -> None:
    """Rename ``temp`` onto ``path`` (both in one folder) and fsync the folder: the end of a
    ``write_durable`` a kill cut short. ``temp`` must be a regular file, not a symlink."""
    with folder_of(path, root, create=False) as (dir_fd, name):
        os.close(open_in(dir_fd, Path(temp).name, os.O_RDONLY))
        os.replace(Path(temp).name, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)


def create_durable(path: Path, data: bytes, *, root: Path | None) -> None:
    """Create ``path`` holding ``data``; ``FileExistsError`` when it exists.

    The content is fsynced under a temp name, then hard-linked onto the
    final name: ``link`` fails when the target exists and never exposes a
    half-written file, which ``O_EXCL`` on the final name would.
    """
    with folder_of(path, root) as (dir_fd, name):
        temp = _write_temp(dir_fd, name, data)
        try:
            os.link(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
        os.fsync(dir_fd)


def remove_file(path: Path, root: Path | None) -> bool:
    """Unlink ``path`` (a symlink there is removed itself, never followed); False when absent."""
    try:
        with folder_of(path, root, create=False) as (dir_fd, name):
            os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def remove_temp_files(path: Path, root: Path | None) -> list[Path]:
    """Remove the temp files a crash left beside ``path``; returns them."""
    return [temp for temp in temp_files_of(path, root) if remove_file(temp, root)]


# A writer holds its temp file for the milliseconds of one write: one this old was left by a
# process that died (a kill between the temp file and its rename or link), never one at work.
TEMP_SWEEP_AGE_SECONDS = 3600


def is_old(path: Path, older_than: float = TEMP_SWEEP_AGE_SECONDS) -> bool:
    try:
        return time.time() - os.lstat(path).st_mtime > older_than
    except FileNotFoundError:
        return False


def remove_old_temp_files(path: Path, root: Path | None, older_than: float = TEMP_SWEEP_AGE_SECONDS) -> list[Path]:
    """Remove the temp files beside ``path`` that a dead writer left (older than ``older_than``)."""
    return [temp for temp in temp_files_of(path, root) if is_old(temp, older_than) and remove_file(temp, root)]


def sweep_temp_files(run_dir: Path, older_than: float = TEMP_SWEEP_AGE_SECONDS) -> list[Path]:
    """Remove the temp files dead writers left in a run (older than ``older_than``); returns them.

    ``submissions/``, ``tasks/``, ``confirmations/``, ``.writer/`` and the whole
    of ``workspace/``, walked through directory fds (no symlink followed). Temp
    receipts stay: a complete one may prove a commit, and the next call for it
    settles that under its lock.
    """
    run_dir = Path(run_dir)
    removed: list[Path] = []
    now = time.time()
    with exclusive_lock(run_dir / WRITER_DIR / "sweep.lock", root=run_dir):
        for top in ("submissions", "tasks", "confirmations", WRITER_DIR, "workspace"):
            try:
                with folder(run_dir / top, run_dir, create=False) as top_fd:
                    for directory, _, names, dir_fd in os.fwalk(".", dir_fd=top_fd):
                        for name in names:
                            if not is_temp_name(name):
                                continue
                            with contextlib.suppress(FileNotFoundError):
                                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                                if now - info.st_mtime > older_than:
                                    os.unlink(name, dir_fd=dir_fd)
                                    removed.append(run_dir / top / directory / name)
            except (FileNotFoundError, UnsafePath):
                continue  # a folder that is missing, or a symlink: nothing of ours is in it
    return removed


def sweep_locks(run_dir: Path) -> list[Path]:
    """Remove the writer's lock files that nobody holds and that keep no note; returns them.

    Each is removed only while this process holds it (``remove_lock_if_free``),
    so a writer at work keeps its lock, and a writer that waited on a removed
    file takes the new one (``exclusive_lock`` re-checks).
    """
    writer = Path(run_dir) / WRITER_DIR
    try:
        with folder(writer, Path(run_dir), create=False) as dir_fd:
            names = sorted(entry.name for entry in os.scandir(dir_fd) if entry.name.endswith(".lock"))
    except FileNotFoundError:
        return []
    return [writer / name for name in names if remove_lock_if_free(writer / name, root=Path(run_dir))]


class LockBusy(OSError):  # noqa: N818 - a state of the world, said to whoever asked
    """A lock held by another process past the wait this writer allows: nothing was done."""


def lock_wait_seconds() -> float:
    """How long a writer waits for a lock another process holds (``RECEIPTS_LOCK_WAIT_SECONDS``,
    600 by default): a call whose lock is held longer is busy, and says so, never waits for ever."""
    try:
        seconds = float(os.environ.get("RECEIPTS_LOCK_WAIT_SECONDS", "600"))
    except ValueError:
        return 600.0
    return seconds if 0 < seconds <= 86400 else 600.0


def flock_within(fd: int, lock_path: Path, seconds: float) -> None:
    """``flock(LOCK_EX)`` on ``fd``, waiting ``seconds`` at most (``LockBusy`` then)."""
    deadline = time.monotonic() + seconds
    # Short naps, never long ones: a lock is mostly held for one fsync, and a waiter that slept
    # 200 ms past its release made four writers at once several times slower.
    pause = 0.0005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockBusy(
                    f"{lock_path.name}: another process has held this lock for {seconds:g} s "
                    "(RECEIPTS_LOCK_WAIT_SECONDS): nothing was done; try again later"
                ) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.005)


@contextlib.contextmanager
def exclusive_lock(lock_path: Path, *, root: Path | None) -> Iterator[int]:
    """An exclusive ``flock`` on ``lock_path``, held for the block; yields the lock file's fd.

    A lock is a file, and a file can be unlinked and made again while a
    process waits on the old one: it would then hold a lock nobody else can
    see. So after the ``flock`` the lock must still be the file at the path
    (same inode); if not, it is taken again on the file that is there now.
    The wait is bounded (``lock_wait_seconds``, ``LockBusy`` past it).
    """
    wait = lock_wait_seconds()
    with folder_of(lock_path, root) as (dir_fd, name):
        while True:
            fd = open_in(dir_fd, name, os.O_RDWR | os.O_CREAT)
            try:
                flock_within(fd, Path(lock_path), wait)
                if _still_the_file(fd, dir_fd, name):
                    break
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
    try:
        yield fd
    finally:
        os.close(fd)


def _still_the_file(fd: int, dir_fd: int, name: str) -> bool:
    try:
        at_path = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (at_path.st_dev, at_path.st_ino) == (held.st_dev, held.st_ino)


def remove_lock_if_free(lock_path: Path, *, root: Path | None) -> bool:
    """Unlink a lock file only while holding its lock, and only when nobody holds it (or waits
    with work recorded in it: a lock file that is not empty keeps a note for the next writer)."""
    try:
        with folder_of(lock_path, root, create=False) as (dir_fd, name):
            try:
                fd = open_in(dir_fd, name, os.O_RDWR)
            except UnsafePath:
                return False  # not a lock the writer made: left alone
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
                if not _still_the_file(fd, dir_fd, name) or os.fstat(fd).st_size:
                    return False
                # Unlinked while held: a writer waiting on this file re-checks and takes the new one.
                os.unlink(name, dir_fd=dir_fd)
                return True
            finally:
                os.close(fd)
    except FileNotFoundError:
        return False


# --- the ledger ------------------------------------------------------------


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


def read_events(run_dir: Path, from_offset: int = 0) -> Iterator[dict[str, Any]]:
    """The ledger's valid events in order, streamed; bad lines and a torn tail are passed over.

    For the writer's rare recovery checks. The reader (``receipts.reader``) is
    the one that reports what is wrong with a ledger. ``from_offset``: start at
    the line that holds that byte (an event appended after the ledger was that
    long starts there or later, since only a torn tail is ever cut).
    """
    try:
        stream = os.fdopen(open_file(Path(run_dir) / LEDGER_NAME, Path(run_dir), os.O_RDONLY), "rb")
    except FileNotFoundError:
        return
    with stream:
        if from_offset > 0:
            stream.seek(_last_newline_end(stream.fileno(), min(from_offset, os.fstat(stream.fileno()).st_size)))
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
    bytes), signs it in a signed run, writes one ``\\n``-terminated line and fsyncs it.
    """
    key = key_for_run(Path(run_dir))  # a signed run's every line is signed
    # The ledger's own lock is a file of the writer's alone: a ledger every reader may open could
    # be locked for ever by any of them (flock works on a read-only handle).
    with exclusive_lock(Path(run_dir) / WRITER_DIR / LEDGER_LOCK, root=Path(run_dir)):
        return _append_locked(run_dir, event_type, fields, key)


def _append_locked(run_dir: Path, event_type: str, fields: Mapping[str, Any], key: Any) -> dict[str, Any]:
    fd = open_file(Path(run_dir) / LEDGER_NAME, Path(run_dir), os.O_RDWR | os.O_CREAT | os.O_APPEND)
    try:
        size = os.fstat(fd).st_size
        end = _complete_end(fd, size)
        if end != size:
            os.ftruncate(fd, end)
        # The chain covers the last line's bytes whatever they are; seq follows the last valid event.
        lines = _lines_backwards(fd, end)
        last_line = next(lines, None)
        prev_sha256 = ZERO_HASH if last_line is None else sha256_hex(last_line)
        seq = 1 if last_line is None else _last_seq(itertools.chain([last_line], lines)) + 1
        if seq > MAX_INT:
            raise ValueError("the ledger's last seq is at the end of its range (2^63 - 1): a person has to look")
        event = {"seq": seq, "ts": format_time(utc_now()), "type": event_type, "prev_sha256": prev_sha256}
        event.update({name: value for name, value in fields.items() if name not in event})
        event = signed(event, key)
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
