"""Opening files without trusting names: directory fds, ``O_NOFOLLOW``, regular files only.

Every file of a run is opened relative to a directory file descriptor with
``O_NOFOLLOW | O_NONBLOCK``: no symlink is followed, nothing outside the run
directory is opened, a FIFO cannot block the reader, and anything that is not a
regular file is a verdict (``Unsafe``), never an exception that escapes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from receipts.findings import Sentence

MAX_JSON_BYTES = 16 * 1024 * 1024
MAX_LINE_BYTES = 1024 * 1024
DEFAULT_STALE_AFTER = dt.timedelta(minutes=15)


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
            raise Unsafe("unsafe_path", Sentence("unsafe_path.symlink_or_not_directory")) from None
        raise


def open_regular(name: str, dir_fd: int) -> tuple[int, os.stat_result]:
    """An fd on a regular file in ``dir_fd``; ``Unsafe`` for a symlink, FIFO, device or directory."""
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise Unsafe("unsafe_path", Sentence("unsafe_path.symlink")) from None
        if error.errno in (errno.EISDIR, errno.ENXIO):
            raise Unsafe("unsafe_path", Sentence("unsafe_path.not_regular")) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise Unsafe("unsafe_path", Sentence("unsafe_path.not_regular"))
    return fd, info


def read_regular(name: str, dir_fd: int, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, or ``Unsafe``."""
    fd, info = open_regular(name, dir_fd)
    try:
        if info.st_size > limit:
            raise Unsafe("oversize", Sentence("oversize.file", size=info.st_size, limit=limit))
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > limit:  # grew while we read
                raise Unsafe("oversize", Sentence("oversize.grew", limit=limit))
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


def list_names(dir_fd: int) -> list[str]:
    """Entry names a reader considers, sorted (``considered``)."""
    with os.scandir(dir_fd) as entries:
        return considered(entry.name for entry in entries)


def considered(names: Iterable[str]) -> list[str]:
    """The names a reader considers, sorted: no dot names (temp files, writer internals), no ``.tmp``."""
    return sorted(name for name in names if not name.startswith(".") and not name.endswith(".tmp"))


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
