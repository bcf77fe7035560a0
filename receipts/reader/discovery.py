"""Finding run directories in a runs root, and telling whether a run changed since last time."""

from __future__ import annotations

import array
import dataclasses
import hashlib
import itertools
import os
import stat
import struct
import time
import zlib
from collections.abc import Callable, MutableMapping
from pathlib import Path

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
    """Whether ``path`` holds a run's own files (a folder under one of their names does not
    count: it is a run whose id is that name, in a runs root)."""
    for name in ("steer.json", LEDGER, "state.json"):
        try:
            if not stat.S_ISDIR(os.lstat(path / name).st_mode):
                return True
        except OSError:
            continue
    return False


def birth_digest(run_dir: Path) -> str:
    """The SHA-256 of a run's steer.json, which ``init`` writes once and nothing rewrites: which
    run a directory holds, whatever its name. "" when it cannot be read (no symlink followed)."""
    try:
        fd = os.open(Path(run_dir) / "steer.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        regular = False
    if not regular:  # a folder, a FIFO: os.fdopen would raise on a folder, and no run is there
        os.close(fd)
        return ""
    with os.fdopen(fd, "rb") as stream:
        try:
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


_FINGERPRINT_CHUNK = 4096  # files stat-ed, and their signatures handed on, this many at a time
_MISSING = (-1, -1, -1, -1, -1)
_NUMBERS = struct.Struct("<5q")
_TOP = ("state.json", "steer.json", LEDGER, *RUN_FOLDERS)
_DIGEST_MODULUS = 1 << 256
_NAMES_MODULUS = 1 << 64


def receipt_bucket(name: str) -> str:
    """The bucket of ``receipts/<name>``: its call id's first two characters (call ids are hex
    digests, so a hundred thousand receipts make 256 buckets of some 400). A name that is not
    UTF-8 never names a call: those share a bucket of their own, kept as text."""
    # A name past ".json" plus two characters starts with its call id's first two: one slice.
    bucket = name[:2] if len(name) > 6 else name.removesuffix(".json")[:2]
    if bucket.isascii():
        return bucket
    try:
        bucket.encode("utf-8")
    except UnicodeEncodeError:
        return "\ufffd"
    return bucket


def part_of(folder: str, name: str) -> str:
    """Which part of a folder's fingerprint the file ``name`` counts in: a receipt in its bucket
    (the buckets a re-import compares), any other file by a checksum of its name."""
    return _parts_of(folder)(name)


def _checksum_part(name: str) -> str:
    return f"#{zlib.crc32(name.encode('utf-8', 'surrogateescape')) & 0xFF:02x}"


def _parts_of(folder: str) -> Callable[[str], str]:
    return receipt_bucket if folder == "receipts" else _checksum_part


def _may_fall_in(folder: str, changed: set[str]) -> Callable[[str], bool]:
    """Whether a name of ``folder`` falls in one of the ``changed`` parts: for receipts, a slice
    first (a million names are looked at, some thousands fall in), then ``receipt_bucket``."""
    part = _parts_of(folder)
    if folder != "receipts" or "\ufffd" in changed:
        return lambda name: part(name) in changed
    return lambda name: (len(name) <= 6 or name[:2] in changed) and part(name) in changed


@dataclasses.dataclass
class Part:
    """The files of a folder whose names fall in one part (``part_of``): how many, the sum of
    each one's digest (SHA-256 of its name and its stat's five numbers), and the sum of a hash
    of each one's name and inode, which a listing of names gives without a ``stat``
    (``relist_run``; Python's own hash, so it means something in this process only)."""

    count: int = 0
    digest: int = 0
    names: int = 0

    def listed(self) -> tuple[int, int]:
        return self.count, self.names % _NAMES_MODULUS


@dataclasses.dataclass
class RunParts:
    """A run directory's fingerprint by parts: the five numbers of each of its own files and
    folders, and each folder's parts (``None``: the folder could not be listed)."""

    top: bytes
    folders: dict[str, dict[str, Part] | None]

    def fingerprint(self) -> str:
        """The run's fingerprint: a digest of the top numbers and of every part, in order."""
        digest = hashlib.sha256(b"callproof run fingerprint 2\n")
        digest.update(self.top)
        for folder in RUN_FOLDERS:
            parts = self.folders.get(folder)
            if parts is None:
                digest.update(f"{folder}/ not listed\n".encode())
                continue
            digest.update(f"{folder}/\n".encode())
            for key in sorted(parts):
                part = parts[key]
                line = f"{key}\0{part.count}\0{part.digest % _DIGEST_MODULUS:064x}\n"
                digest.update(line.encode("utf-8", "surrogateescape"))
        return digest.hexdigest()

    def count(self, folder: str) -> int:
        """How many files ``folder`` held when listed."""
        return sum(part.count for part in (self.folders.get(folder) or {}).values())


def run_fingerprint(
    run_dir: Path,
    receipt_signatures: MutableMapping[str, str] | None = None,
    confirmation_names: set[str] | None = None,
) -> str:
    """A digest of every relevant file's name and stat: equal means nothing changed.

    ``receipt_signatures``, when given, is filled with each receipt file's signature
    (``safe_open.signature_from``), so that the reader need not stat them again;
    ``confirmation_names`` with the names in ``confirmations/``. See ``list_run``.
    """
    return list_run(run_dir, receipt_signatures, confirmation_names).fingerprint()


def list_run(
    run_dir: Path,
    receipt_signatures: MutableMapping[str, str] | None = None,
    confirmation_names: set[str] | None = None,
) -> RunParts:
    """The run's fingerprint by parts, every file stat-ed (``run_fingerprint``).

    ctime is in it because no program can set it back, so an edit that restores
    size and mtime still changes the fingerprint. Each part is a sum over its files, so the
    order a folder lists them in does not matter, and memory holds a few numbers per part,
    not the files: a million receipts cost no more than a thousand. A sum of digests is no
    seal (the ledger's chain and the digests are): it tells a change, which nobody can aim,
    since ctime and the inode are the kernel's.
    """
    top = _top_numbers(run_dir)
    folders: dict[str, dict[str, Part] | None] = {}
    for folder in RUN_FOLDERS:
        try:
            entries = os.scandir(run_dir / folder)
        except OSError:
            folders[folder] = None
            continue
        parts: dict[str, Part] = {}
        with entries:
            # A chunk at a time: a run can hold a million receipts.
            while chunk := list(itertools.islice(entries, _FINGERPRINT_CHUNK)):
                _add_stat_ed(folder, chunk, parts, receipt_signatures if folder == "receipts" else None)
                if confirmation_names is not None and folder == "confirmations":
                    confirmation_names.update(entry.name for entry in chunk)
        folders[folder] = parts
    return RunParts(top, folders)


def relist_run(
    run_dir: Path,
    before: RunParts,
    receipt_signatures: MutableMapping[str, str],
    confirmation_names: set[str],
) -> tuple[RunParts, set[str] | None]:
    """The run's fingerprint by parts again, ``before`` its last (``list_run`` or this, in
    this process): each folder listed by names and inodes, which needs no ``stat``, and only
    the files of the parts whose names or inodes changed stat-ed (a file added, removed, or put
    in place by a rename, as the writer puts every file but the ledger). A part whose names
    and inodes are as they were keeps its digest: an edit in place inside it (same inode) is
    not seen, as the glance does not see it; ``list_run`` sees it.

    Fills ``receipt_signatures`` with the receipts of the buckets stat-ed again, and
    ``confirmation_names`` with every name in ``confirmations/``; returns the buckets of
    receipts stat-ed again (``None``: every one, the folder listed whole or not at all).
    """
    top = _top_numbers(run_dir)
    folders: dict[str, dict[str, Part] | None] = {}
    relisted: set[str] | None = None
    for folder in RUN_FOLDERS:
        known = before.folders.get(folder)
        part_of_name = _parts_of(folder)
        counts: dict[str, int] = {}
        names: dict[str, int] = {}
        try:
            with os.scandir(run_dir / folder) as entries:
                for entry in entries:
                    key = part_of_name(entry.name)
                    counts[key] = counts.get(key, 0) + 1
                    names[key] = names.get(key, 0) + hash((entry.name, entry.inode()))
                    if folder == "confirmations":
                        confirmation_names.add(entry.name)
        except OSError:
            folders[folder] = None
            continue
        if known is None:
            changed = set(counts)
        else:
            listed = {key: (count, names[key] % _NAMES_MODULUS) for key, count in counts.items()}
            changed = {key for key in listed.keys() | known.keys() if key not in known or key not in listed}
            changed |= {key for key in listed.keys() & known.keys() if listed[key] != known[key].listed()}
            if not changed and _folder_moved(before.top, top, folder):
                # Its entries changed, and no name or inode shows it: a file removed and another
                # made under its name with the freed inode (``rm`` then ``cp``), a rename over it
                # twice. Every file of the folder, then.
                changed = set(counts)
        parts = {key: part for key, part in (known or {}).items() if key not in changed}
        signatures = receipt_signatures if folder == "receipts" else None
        if changed:
            falls_in = _may_fall_in(folder, changed)
            try:
                with os.scandir(run_dir / folder) as entries:
                    wanted = (entry for entry in entries if falls_in(entry.name))
                    while chunk := list(itertools.islice(wanted, _FINGERPRINT_CHUNK)):
                        _add_stat_ed(folder, chunk, parts, signatures)
            except OSError:
                folders[folder] = None
                continue
        folders[folder] = parts
        if folder == "receipts" and known is not None:
            relisted = changed
    return RunParts(top, folders), relisted


def _add_stat_ed(
    folder: str, entries: list[os.DirEntry], parts: dict[str, Part], signatures: MutableMapping[str, str] | None
) -> None:
    """Each of ``entries`` stat-ed, counted in its part; the signatures of those stat-ed."""
    listed: list[tuple[str, str]] = []
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            numbers = _MISSING  # gone since it was listed
        else:
            numbers = _numbers(info)
            listed.append((entry.name, signature_from(info)))
        name = entry.name.encode("utf-8", "surrogateescape")
        key = part_of(folder, entry.name)
        part = parts.get(key) or parts.setdefault(key, Part())
        part.count += 1
        part.digest += int.from_bytes(hashlib.sha256(name + b"\0" + _NUMBERS.pack(*numbers)).digest())
        part.names += hash((entry.name, entry.inode()))
    if signatures is not None:
        signatures.update(listed)


def _folder_moved(before: bytes, now: bytes, folder: str) -> bool:
    """Whether ``folder``'s own numbers (its times: an entry added, removed or renamed) differ
    between two ``_top_numbers``."""
    start = _TOP.index(folder) * 5
    then, current = array.array("q", before)[start : start + 5], array.array("q", now)[start : start + 5]
    return then != current


def _top_numbers(run_dir: Path) -> bytes:
    numbers = array.array("q")
    for name in _TOP:
        try:
            numbers.extend(_numbers(os.lstat(run_dir / name)))
        except OSError:
            numbers.extend(_MISSING)
    return numbers.tobytes()


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
