"""The reader's side of the confined open: size limits, whole reads within them, file signatures,
and the names a reader considers.

Every file of a run is opened through ``receipts.confined`` in its read-only mode, relative to
a directory file descriptor with ``O_NOFOLLOW | O_NONBLOCK``: no symlink is followed, nothing
outside the run directory is opened, a FIFO cannot block the reader, and anything that is not a
regular file, or a file over its limit, is a verdict (``UnsafePath``: its ``code`` and
``detail`` are the finding), never an exception that escapes the reader.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import stat
from collections.abc import Iterable, Iterator

from receipts.confined import UnsafePath, open_regular
from receipts.findings import Sentence
from receipts.reader.diskset import SpillingMap

MAX_JSON_BYTES = 16 * 1024 * 1024
MAX_LINE_BYTES = 1024 * 1024
DEFAULT_STALE_AFTER = dt.timedelta(minutes=15)


@dataclasses.dataclass(frozen=True)
class Limits:
    max_json_bytes: int = MAX_JSON_BYTES
    max_line_bytes: int = MAX_LINE_BYTES
    stale_after: dt.timedelta = DEFAULT_STALE_AFTER


DEFAULT_LIMITS = Limits()


# --- reading files whole, within a limit -------------------------------------------


def read_regular(name: str, dir_fd: int, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, or ``UnsafePath``."""
    fd, info = open_regular(name, dir_fd)
    try:
        if info.st_size > limit:
            detail = Sentence("oversize.file", size=info.st_size, limit=limit)
            raise UnsafePath(f"{name}: {detail}", detail=detail, code="oversize")
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > limit:  # grew while we read
                detail = Sentence("oversize.grew", limit=limit)
                raise UnsafePath(f"{name}: {detail}", detail=detail, code="oversize")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def signature_of(name: str, dir_fd: int) -> str:
    """A regular file's size, mtime, ctime and inode, or "" for anything else.

    ctime is in it because no program can set it back; the inode because the
    writer replaces a file by renaming a new one over it. Taken before the file
    is read, so a change made while it is read shows on the next import.
    """
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return ""
    return signature_from(info)


def signature_from(info: os.stat_result) -> str:
    """``signature_of`` from a stat already made (the run's fingerprint makes one of every file)."""
    if not stat.S_ISREG(info.st_mode):
        return ""
    return f"{info.st_size}.{info.st_mtime_ns}.{info.st_ctime_ns}.{info.st_ino}"


# How many names a folder's listing holds in memory; past it, they are sorted on disk (``SpillingMap``):
# a million receipts' names took some 100 MiB in the process that reads them.
NAMES_IN_MEMORY = 20_000


def list_names(dir_fd: int, in_memory: int = NAMES_IN_MEMORY) -> Iterator[str]:
    """Entry names a reader considers (``considered``), sorted; the folder is listed whole at
    the first name asked for."""
    listing = SpillingMap(in_memory=in_memory)
    try:
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                if _considered(entry.name):
                    listing[entry.name] = ""
        yield from listing
    finally:
        listing.close()


def _considered(name: str) -> bool:
    return not name.startswith(".") and not name.endswith(".tmp")


def considered(names: Iterable[str]) -> list[str]:
    """The names a reader considers, sorted: no dot names (temp files, writer internals), no ``.tmp``."""
    return sorted(filter(_considered, names))


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
