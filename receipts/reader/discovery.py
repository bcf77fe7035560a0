"""Finding run directories in a runs root, and telling whether a run changed since last time."""

from __future__ import annotations

import array
import dataclasses
import hashlib
import itertools
import os
import stat
import tempfile
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import IO

from receipts import protocol
from receipts.findings import FindingRecord, Sentence, storable_text
from receipts.protocol import LEDGER_NAME as LEDGER
from receipts.protocol import RUN_FOLDERS
from receipts.reader.safe_open import signature_from

# --- the runs root ---------------------------------------------------------


@dataclasses.dataclass
class Discovery:
    """The run directories found, by name under ``base``, and what else the root holds.

    Names, not paths: a root of 20,000 runs is listed every pass of a watch, which makes
    paths of the few it checks (``runs`` makes them all)."""

    base: Path
    names: list[str]
    findings: list[FindingRecord]

    @property
    def runs(self) -> list[Path]:
        return [self.base / name for name in self.names]


def looks_like_run(path: Path) -> bool:
    return any(os.path.lexists(path / name) for name in ("steer.json", LEDGER, "state.json"))


def birth_digest(run_dir: Path) -> str:
    """The SHA-256 of a run's steer.json, which ``init`` writes once and nothing rewrites: which
    run a directory holds, whatever its name. "" when it cannot be read (no symlink followed)."""
    try:
        fd = os.open(Path(run_dir) / "steer.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as stream:
        try:
            if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                return ""
            return hashlib.file_digest(stream, "sha256").hexdigest()
        except OSError:
            return ""


def discover_runs(root: Path) -> Discovery:
    """The run directories under ``root`` (or ``root`` itself when it is one).

    Every other entry of the root is reported, never followed: a symlink, a
    name that is not a run_id (or not UTF-8), a regular file, a dot-directory.
    """
    root = Path(root)
    label = storable_text(str(root))
    if ".." in root.parts:
        return Discovery(root, [], [FindingRecord("unsafe_path", label, Sentence("unsafe_path.dot_dot"))])
    if label != str(root):
        return Discovery(root, [], [FindingRecord("unsafe_path", label, Sentence("unsafe_path.root_not_utf8"))])
    if root.is_symlink():
        return Discovery(root, [], [FindingRecord("unsafe_path", label, Sentence("unsafe_path.root_symlink"))])
    if not root.is_dir():
        return Discovery(root, [], [FindingRecord("unsafe_path", label, Sentence("unsafe_path.not_a_directory"))])
    if looks_like_run(root):
        if not protocol.valid_run_id(root.name):
            return Discovery(root, [], [FindingRecord("unsafe_path", root.name, Sentence("unsafe_path.root_run_id"))])
        return Discovery(root.parent, [root.name], [])
    runs: list[str] = []
    findings: list[FindingRecord] = []
    try:
        with os.scandir(root) as listing:
            entries = sorted((entry.name, entry) for entry in listing)
    except OSError as error:
        return Discovery(
            root, [], [FindingRecord("unsafe_path", label, Sentence("unsafe_path.not_listed", error=error.strerror))]
        )
    for name, entry in entries:
        # The entry's type as the listing gave it: no stat per entry, for a root of 20,000 runs
        # that a watch lists every pass (DirEntry stats only where the file system gives no type).
        try:
            kind = _kind(entry)
        except OSError:
            continue  # gone since it was listed
        if stat.S_ISLNK(kind):
            findings.append(FindingRecord("unsafe_path", name, Sentence("unsafe_path.symlink_in_root")))
        elif not stat.S_ISDIR(kind):
            if stat.S_ISREG(kind):
                findings.append(FindingRecord("not_a_run", name, Sentence("not_a_run.regular_file")))
            else:
                findings.append(FindingRecord("unsafe_path", name, Sentence("unsafe_path.special_file")))
        elif name.startswith("."):
            findings.append(FindingRecord("not_a_run", name, Sentence("not_a_run.dot_directory")))
        elif not protocol.valid_run_id(name):
            findings.append(FindingRecord("unsafe_path", name, Sentence("unsafe_path.run_id")))
        else:
            runs.append(name)
    return Discovery(root, runs, findings)


def _kind(entry: os.DirEntry) -> int:
    """A mode with only the file type of ``entry``, not following a symlink."""
    if entry.is_symlink():
        return stat.S_IFLNK
    if entry.is_dir(follow_symlinks=False):
        return stat.S_IFDIR
    if entry.is_file(follow_symlinks=False):
        return stat.S_IFREG
    return stat.S_IFMT(entry.stat(follow_symlinks=False).st_mode)


# --- fingerprint -----------------------------------------------------------


# What of the stat numbers ``run_fingerprint`` holds in memory before it writes them to a temporary
# file (40 bytes a file): its memory stays bounded whatever the number of receipts.
FINGERPRINT_NUMBERS_IN_MEMORY = 8 * 1024 * 1024
_FINGERPRINT_CHUNK = 4096  # names hashed, and numbers set aside, this many files at a time
_MISSING = (-1, -1, -1, -1, -1)


def run_fingerprint(
    run_dir: Path,
    receipt_signatures: MutableMapping[str, str] | None = None,
    confirmation_names: set[str] | None = None,
) -> str:
    """A digest of every relevant file's name and stat: equal means nothing changed.

    ``receipt_signatures``, when given, is filled with each receipt file's signature
    (``safe_open.signature_from``), so that the reader need not stat them again;
    ``confirmation_names`` with the names in ``confirmations/``.

    ctime is in it because no program can set it back, so an edit that restores
    size and mtime still changes the fingerprint. Entries are taken in the
    order the directory lists them: an unchanged directory lists the same way,
    and a different order can only cause one needless re-read, never hide a change.

    The digest is that of every name joined by NUL, then of every file's five numbers; it is
    taken as the directory is listed, the numbers kept aside in a temporary file past
    ``FINGERPRINT_NUMBERS_IN_MEMORY``, so that a million receipts cost no more memory than
    a thousand (listing them whole first took 1.2 GB at a million).
    """
    with _Fingerprint() as fingerprint:
        for name in ("state.json", "steer.json", LEDGER, *RUN_FOLDERS):
            try:
                info = os.lstat(run_dir / name)
            except OSError:
                info = None
            fingerprint.add(name, info)
        for folder in RUN_FOLDERS:
            fingerprint.add(f"{folder}/", None, counted=False)
            try:
                entries = os.scandir(run_dir / folder)
            except OSError:
                continue
            signatures = receipt_signatures if folder == "receipts" else None
            names = confirmation_names if folder == "confirmations" else None
            with entries:
                # A chunk at a time: a run can hold a million receipts.
                while chunk := list(itertools.islice(entries, _FINGERPRINT_CHUNK)):
                    numbers = array.array("q")
                    listed: list[tuple[str, str]] = []
                    for entry in chunk:
                        try:
                            info = entry.stat(follow_symlinks=False)
                        except OSError:
                            numbers.extend(_MISSING)
                            continue
                        numbers.extend(_numbers(info))
                        listed.append((entry.name, signature_from(info)))
                    fingerprint.take([entry.name for entry in chunk], numbers)
                    if names is not None:
                        names.update(entry.name for entry in chunk)
                    if signatures is not None:
                        signatures.update(listed)
        return fingerprint.hexdigest()


class _Fingerprint:
    """The digest ``run_fingerprint`` takes: the names hashed as they come, the numbers set aside
    (in memory, then in an unnamed temporary file) and hashed after every name."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self.names: list[str] = []
        self.numbers = array.array("q")
        self.first = True
        self.aside: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=FINGERPRINT_NUMBERS_IN_MEMORY)  # noqa: SIM115

    def __enter__(self) -> _Fingerprint:
        return self

    def __exit__(self, *_: object) -> None:
        self.aside.close()

    def add(self, name: str, info: os.stat_result | None, *, counted: bool = True) -> None:
        """A name, and its stat (``None``: it could not be taken) unless it is not ``counted``."""
        self.names.append(name)
        if counted:
            self.numbers.extend(_MISSING if info is None else _numbers(info))

    def take(self, names: list[str], numbers: array.array) -> None:
        """A chunk of names and their numbers, five each."""
        self.names += names
        self.numbers += numbers
        self._flush()

    def _flush(self) -> None:
        if self.names:  # the same bytes as every name joined at once
            joined = "\0".join(self.names)
            self.digest.update((joined if self.first else "\0" + joined).encode("utf-8", "surrogateescape"))
            self.first = False
        self.aside.write(self.numbers.tobytes())
        self.names, self.numbers = [], array.array("q")

    def hexdigest(self) -> str:
        self._flush()
        self.aside.seek(0)
        while chunk := self.aside.read(64 * 1024):
            self.digest.update(chunk)
        return self.digest.hexdigest()


def _numbers(info: os.stat_result) -> tuple[int, int, int, int, int]:
    return (info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)


@dataclasses.dataclass(frozen=True)
class Glance:
    """A run directory at a glance: the stat of the directory, its own files and its folders,
    not of the files in them (``run_glance``).

    ``newest_ns``: the latest mtime or ctime among them; ``taken_ns``: the clock just before
    they were taken. A glance whose ``newest_ns`` is close to ``taken_ns`` proves little: a
    change in the same tick of the file system's clock leaves the same times (git's "racy"
    index), so whoever compares glances says how far apart is enough."""

    digest: str
    newest_ns: int
    taken_ns: int


def run_glance(run_dir: Path) -> Glance:
    """What the writer touches when it writes, in a handful of ``lstat`` calls whatever the
    run's size: the run directory, ``state.json``, ``steer.json``, the ledger and the folders.

    The writer appends to the ledger (its size and mtime move) and puts every other file in
    place by a rename, which changes the mtime and ctime of the folder it lands in: any write
    of the writer changes the glance, a rename in the same clock tick as the last glance aside.
    An edit in place of a file inside a folder (a person's editor writing over a receipt) does
    not: only ``run_fingerprint`` sees that.
    """
    taken_ns = time.time_ns()
    numbers = array.array("q")
    newest = 0
    for name in (".", "state.json", "steer.json", LEDGER, *RUN_FOLDERS):
        try:
            info = os.lstat(run_dir / name)
        except OSError as error:
            numbers.extend((-1, error.errno or 0, -1, -1, -1))
            continue
        numbers.extend((info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino))
        newest = max(newest, info.st_mtime_ns, info.st_ctime_ns)
    return Glance(hashlib.sha256(numbers.tobytes()).hexdigest(), newest, taken_ns)
