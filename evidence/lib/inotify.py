"""Waking when a folder changes: Linux's inotify through ctypes (the standard library has no
binding), and ``Waker``, which a watch waits on between passes instead of sleeping.

Standard library only: the torture tests use ``inotify_watch`` and ``read_inotify_events`` too.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import select
import struct
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

log = logging.getLogger("callproof.importer")

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_OPEN = 0x2, 0x4, 0x8, 0x20
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_Q_OVERFLOW, IN_IGNORED = 0x4000, 0x8000
IN_ONLYDIR, IN_DONT_FOLLOW = 0x01000000, 0x02000000
# What a write changes in a folder: a file appended to (the ledger), put in place by a rename,
# created, removed, or its times or mode changed.
CHANGE_EVENTS = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
INOTIFY_EVENT = struct.Struct("iIII")  # wd, mask, cookie, length of the name that follows


def _libc() -> ctypes.CDLL | None:
    """The C library when it has inotify (Linux); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    return libc if hasattr(libc, "inotify_init1") else None


_LIBC = _libc()


def available() -> bool:
    return _LIBC is not None


def _init() -> int:
    if _LIBC is None:
        raise OSError(errno.ENOSYS, "inotify is not available here")
    fd = _LIBC.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1 failed")
    return fd


def _add_watch(fd: int, folder: Path, events: int) -> int:
    assert _LIBC is not None  # an fd exists only where _init found it
    wd = _LIBC.inotify_add_watch(fd, os.fsencode(folder), events)
    if wd < 0:
        error = ctypes.get_errno()
        raise OSError(error, f"inotify_add_watch failed on {folder}: {os.strerror(error)}")
    return wd


def inotify_watch(folders: Sequence[Path], events: int) -> int:
    """A non-blocking inotify descriptor watching ``folders``."""
    fd = _init()
    try:
        for folder in folders:
            _add_watch(fd, folder, events)
    except OSError:
        os.close(fd)
        raise
    return fd


def read_inotify_events(fd: int) -> list[tuple[int, str]]:
    """The events waiting on ``fd``, as (mask, name)."""
    return [(mask, name) for _, mask, name in _read_events(fd)]


def _read_events(fd: int) -> list[tuple[int, int, str]]:
    found = []
    with contextlib.suppress(BlockingIOError):
        while data := os.read(fd, 65536):
            offset = 0
            while offset < len(data):
                wd, mask, _, length = INOTIFY_EVENT.unpack_from(data, offset)
                name = data[offset + INOTIFY_EVENT.size : offset + INOTIFY_EVENT.size + length]
                found.append((wd, mask, os.fsdecode(name.rstrip(b"\0"))))
                offset += INOTIFY_EVENT.size + length
    return found


# After the first event, how long a waker goes on collecting: a writer's command is several
# writes (a receipt, then its ledger line), which one pass had better see together. At most
# SETTLE_AT_MOST, so that a writer that never stops does not hold the pass back.
SETTLE = 0.02
SETTLE_AT_MOST = 0.2


class Waker:
    """Waits for the next change in the folders it follows, or for a timeout, whichever comes
    first: a watch's pause between passes.

    ``follow`` says which folders (the runs root, for new runs; each checked run's directory and
    folders, for what the writer writes); a folder it can no longer watch (gone, not a folder,
    the user's watches used up: ``/proc/sys/fs/inotify/max_user_watches``) is waited on by the
    timeout alone, as is everything where inotify is not (not Linux): ``wait`` then sleeps.
    ``woken``: how many waits a change ended before their timeout.
    """

    def __init__(self) -> None:
        self.fd: int | None = None
        self.watched: dict[str, int] = {}  # folder -> watch descriptor
        self.woken = 0
        self.refused = 0  # folders inotify would not watch (said once): the interval waits for them
        if available():
            try:
                self.fd = _init()
            except OSError as error:  # the user's instances used up: max_user_instances
                log.warning("inotify unavailable, the watch sleeps between passes: %s", error)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.watched.clear()

    def __enter__(self) -> Waker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def follow(self, folders: Iterable[Path]) -> int:
        """Watch ``folders`` from now on, and no other; how many were not watched before (a
        write in one of them since the caller last looked at it woke nobody)."""
        if self.fd is None:
            return 0
        added = 0
        wanted = {str(folder) for folder in folders}
        for folder in self.watched.keys() - wanted:
            wd = self.watched.pop(folder)
            assert _LIBC is not None
            _LIBC.inotify_rm_watch(self.fd, wd)  # fails harmlessly when the folder is gone
        for folder in sorted(wanted - self.watched.keys()):
            try:
                self.watched[folder] = _add_watch(self.fd, Path(folder), CHANGE_EVENTS | IN_ONLYDIR | IN_DONT_FOLLOW)
                added += 1
            except OSError as error:
                if error.errno == errno.ENOENT:
                    continue  # a run's folder not made yet: its directory's watch sees it made
                if not self.refused:
                    log.warning("not watching %s (and maybe others): their changes wait for the interval: %s",
                                folder, error.strerror)  # fmt: skip
                self.refused += 1
        return added

    def drain(self) -> None:
        """Forget the changes seen so far: what comes next is looked at anyway."""
        if self.fd is not None:
            self._forget_gone(_read_events(self.fd))

    def wait(self, timeout: float) -> bool:
        """Return at the first change in a followed folder (True), or after ``timeout`` seconds
        (False)."""
        if self.fd is None:
            time.sleep(timeout)
            return False
        deadline = time.monotonic() + timeout
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if not poller.poll(left * 1000):
                continue
            events = _read_events(self.fd)
            self._forget_gone(events)
            if any(mask & (CHANGE_EVENTS | IN_Q_OVERFLOW) for _, mask, _ in events):  # overflowed: some lost
                break
        settle_until = time.monotonic() + SETTLE_AT_MOST
        while poller.poll(SETTLE * 1000) and time.monotonic() < settle_until:
            self._forget_gone(_read_events(self.fd))
        self.woken += 1
        return True

    def _forget_gone(self, events: list[tuple[int, int, str]]) -> None:
        """A folder removed or moved away is no longer watched (IN_IGNORED): its descriptor too."""
        gone = {wd for wd, mask, _ in events if mask & IN_IGNORED}
        if gone:
            self.watched = {folder: wd for folder, wd in self.watched.items() if wd not in gone}
