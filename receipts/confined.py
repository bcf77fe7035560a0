"""Opening what lies below a run directory without trusting its names: the one confined open,
for the reader and the writer alike.

Everything under a run directory was written by an agent, and any name there may be a symlink
planted to send a read or a write elsewhere (a settle truncating a database file through a
linked events.jsonl), or a FIFO that would hang whoever opens it. So every folder and file
below a run directory is reached one name at a time, relative to directory file descriptors,
with ``O_NOFOLLOW | O_NONBLOCK``: no name below the run directory is ever followed, and what is
not the folder or regular file expected there is refused (``UnsafePath``), never opened for good.

Two modes. ``READ`` only looks: no folder is made and no file is opened for writing; the reader
opens in this mode alone. ``WRITE`` is the writer's: a missing folder on the way is made, and a
file is opened with the flags the writer asks for. Standard library only, and nothing here runs
at import: the reader loads this module, never the writer's (``receipts.durable``).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from receipts.findings import Sentence
from receipts.protocol import WRITER_DIR, load_json_strict


class Mode(enum.Enum):
    READ = "read"  # looks only: no folder made, no file opened for writing
    WRITE = "write"  # the writer's: a missing folder made, a file opened with the flags asked for


READ, WRITE = Mode.READ, Mode.WRITE

# The flags that change a file or make one: never in a READ open.
WRITING_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_NOT_FOLLOWED = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | _NOT_FOLLOWED


class UnsafePath(ValueError):  # noqa: N818 - a verdict on a path, said to the person who asked
    """A name below a run directory that is a symlink, or not the folder or regular file expected
    there, or a file over the reader's size limit: not followed, not opened, not written through.

    Its message names the path, for the person who asked the writer. ``code`` and ``detail``
    are the reader's finding (``unsafe_path`` or ``oversize``, and the sentence that says it:
    the finding's subject names the file); a refusal the reader never meets has its message as
    its detail. A ``ValueError``, as every record the writer cannot act on.
    """

    def __init__(self, message: str, *, detail: str | None = None, code: str = "unsafe_path") -> None:
        super().__init__(message)
        self.code = code
        self.detail = message if detail is None else detail


def open_folder(name: str | Path, dir_fd: int | None = None, mode: Mode = READ) -> int:
    """An fd on the folder ``name`` in ``dir_fd`` (``name`` a path when ``dir_fd`` is ``None``),
    never through a symlink; in ``WRITE`` mode made first when missing."""
    if mode is WRITE:
        with contextlib.suppress(FileExistsError):
            # The writer's own folder (its locks) is its user's alone: a lock another user can open
            # is a lock another user can hold (flock works on a read-only handle).
            os.mkdir(name, 0o700 if Path(name).name == WRITER_DIR else 0o755, dir_fd=dir_fd)
    try:
        return os.open(name, _FOLDER_FLAGS, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePath(
                f"{name} is a symlink or not a folder: not followed",
                detail=Sentence("unsafe_path.symlink_or_not_directory"),
            ) from None
        raise


def open_regular(
    name: str, dir_fd: int, mode: Mode = READ, flags: int = os.O_RDONLY, perms: int = 0o644
) -> tuple[int, os.stat_result]:
    """An fd on the regular file ``name`` in ``dir_fd``, and its stat; never through a symlink,
    and never a FIFO, device or folder (``O_NONBLOCK`` keeps a FIFO from hanging the open; it is
    then refused). ``flags``: the writer's (``WRITE`` mode only), whose fd is then blocking again,
    as an ordinary open's."""
    if mode is READ and flags & WRITING_FLAGS:
        raise ValueError(f"a read-only open of {name} asked to write (flags {flags:#o})")
    try:
        fd = os.open(name, flags | _NOT_FOLLOWED, perms, dir_fd=dir_fd)
    except OSError as error:
        not_opened = f"{name} is a symlink or not a regular file: not opened"
        if error.errno == errno.ELOOP:
            raise UnsafePath(not_opened, detail=Sentence("unsafe_path.symlink")) from None
        if error.errno in (errno.EISDIR, errno.ENXIO):
            raise UnsafePath(not_opened, detail=Sentence("unsafe_path.not_regular")) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UnsafePath(f"{name} is not a regular file: not opened", detail=Sentence("unsafe_path.not_regular"))
    if mode is WRITE:
        os.set_blocking(fd, True)
    return fd, info


def mode_for(flags: int) -> Mode:
    """The mode an open with ``flags`` needs: ``WRITE`` when they change or make the file."""
    return WRITE if flags & WRITING_FLAGS else READ


# --- paths below a run directory --------------------------------------------------------
#
# The writer names files by path: each is reached from the run directory (``root``) one folder
# at a time. The run directory's own path is the caller's (an operator's choice), and trusted.


def not_a_symlink(run_dir: Path) -> Path:
    """``run_dir`` when it is a folder itself, not a symlink to one (``UnsafePath``).

    The writer trusts its run directory's path (an agent's may well be a symlink it made). The
    dashboard does not: it writes a person's decision into a run directory it found under a
    runs root, where the reader never follows a symlink, and one swapped for a symlink since
    would have the writer make ``.writer/`` and a lock in whatever it points to before refusing.
    A path that cannot be looked at is returned as it is: the writer's own first open says why."""
    try:
        info = os.lstat(run_dir)
    except OSError:
        return Path(run_dir)
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafePath(f"the run directory {run_dir} is a symlink or not a folder: not followed")
    return Path(run_dir)


def _below(path: Path, root: Path) -> tuple[str, ...]:
    try:
        parts = Path(path).relative_to(root).parts
    except ValueError:
        raise UnsafePath(f"{path} is not inside the run directory {root}") from None
    if any(part in ("..", ".") for part in parts):
        raise UnsafePath(f"{path}: not a plain name inside the run directory {root}")
    return parts


def _enter(dir_fd: int, name: str, mode: Mode) -> int:
    """The fd of folder ``name`` in ``dir_fd``, as ``open_folder`` opens it; closes ``dir_fd``."""
    try:
        return open_folder(name, dir_fd, mode)
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def folder(directory: Path, root: Path | None, *, create: bool = True) -> Iterator[int]:
    """An fd on ``directory``. Below ``root`` every folder is entered without following a
    symlink (``UnsafePath``), and made when missing and ``create`` (``WRITE`` mode). ``root=None``:
    a path of the operator's (an archive), not below any run directory."""
    if root is None:
        if create:
            Path(directory).mkdir(parents=True, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    else:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        for part in _below(directory, root):
            fd = _enter(fd, part, WRITE if create else READ)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def folder_of(path: Path, root: Path | None, *, create: bool = True) -> Iterator[tuple[int, str]]:
    """An fd on ``path``'s folder (as ``folder`` opens it), and ``path``'s last name."""
    if root is not None and not _below(path, root):
        raise UnsafePath(f"{path}: not a plain name inside the run directory {root}")
    with folder(Path(path).parent, root, create=create) as dir_fd:
        yield dir_fd, Path(path).name


def open_in(dir_fd: int, name: str, flags: int, perms: int = 0o644) -> int:
    """``name`` in ``dir_fd`` opened with ``flags`` (``open_regular``, in the mode they need)."""
    return open_regular(name, dir_fd, mode_for(flags), flags, perms)[0]


def open_file(path: Path, root: Path | None, flags: int, perms: int = 0o644) -> int:
    """``path`` opened as ``open_in`` does, its folders entered as ``folder_of`` does (none made
    unless ``flags`` creates the file)."""
    with folder_of(path, root, create=bool(flags & os.O_CREAT)) as (dir_fd, name):
        return open_in(dir_fd, name, flags, perms)


def read_file(path: Path, root: Path | None) -> bytes:
    """The bytes of a regular file below ``root`` (``FileNotFoundError`` when absent)."""
    with os.fdopen(open_file(path, root, os.O_RDONLY), "rb") as stream:
        return stream.read()


def read_json_file(path: Path, root: Path | None) -> Any:
    """A strict read of one JSON file; ``None`` when it does not exist. Below ``root`` (the run
    directory) no symlink is followed and only a regular file is read (``UnsafePath``)."""
    try:
        data = read_file(path, root)
    except FileNotFoundError:
        return None
    return load_json_strict(data)
