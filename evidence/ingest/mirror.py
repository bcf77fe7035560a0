"""The server's copy of what agent hosts ship (``callproof ship``), run by run: a push is checked
whole before a byte of it is written, applied idempotently, and what the mirror and the host each
hold of every run is kept beside it (``ShippedRun``), on the server's clock.

How the shipper and the server agree (docs/operations.md, "How the shipper and the server agree"):

- A run is one generation: the SHA-256 of its steer.json, which ``init`` writes once. A push
  names it; a new run under a run_id whose old run the mirror still holds is refused (409), one
  whose old run was archived away is the new run.
- The ledger grows at the mirror's own end. A chunk the mirror already holds, byte for byte, is
  taken and not written again (a shipper killed after the server applied its push, or whose
  answer a proxy lost, sends it again). A chunk that starts past the mirror's end, or whose bytes
  differ from the mirror's, is refused (409) with the mirror's size and the SHA-256 of what it
  holds: the shipper goes on from there when its own ledger starts with those bytes, and says
  why it cannot otherwise.
- A file is sent whole, or chunk by chunk into a part beside the mirror, put in place when its
  last chunk came and the whole matched its SHA-256. A chunk the part holds already is taken.
- Nothing is written for a push that is refused: every item, the host's rate, its new runs and
  its quota are checked first, under the host's row lock (one push of a host at a time).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import datetime as dt
import hashlib
import itertools
import os
import shutil
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Sum
from django.db.models.functions import Greatest

from evidence.models import Host, Run, ShippedRun
from receipts import confined, durable, protocol
from receipts.reader import MAX_JSON_BYTES

LEDGER_NAME = protocol.LEDGER_NAME
LEDGER, FILE = "ledger", "file"
# What one push may carry: items, and bytes an item (the shipper sends chunks of 384 KiB).
MAX_ITEMS = 200
MAX_CHUNK_BYTES = 512 * 1024
# How far a shipper's numbers go: a ledger of a petabyte is not a run, it is an attack (and sums
# of sizes past 2**63 are an error on SQLite).
MAX_OFFSET = 2**50


@dataclasses.dataclass
class ShipError(Exception):
    """A request refused: its HTTP status, a sentence for the shipper's log, and what the shipper
    needs to go on (the mirror's size, a time to wait)."""

    status: int
    message: str
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    freed: int = 0  # bytes of a part removed with the refusal: they no longer count against the quota


@dataclasses.dataclass(frozen=True)
class Piece:
    """One item of a push, checked: ledger bytes at ``offset``, or a chunk of file ``path``
    (``size`` bytes whole, ``sha256`` the whole's)."""

    kind: str
    offset: int
    data: bytes
    sha256: str
    path: str = ""
    size: int = 0


@dataclasses.dataclass(frozen=True)
class Push:
    run_id: str
    generation: str  # "" from a shipper that does not say it, or a run with no steer.json
    host_ledger_bytes: int | None  # the host's ledger when the shipper read it
    more: bool  # more pushes of this run follow in this pass
    pieces: list[Piece]
    ledger_held: int | None = None  # what the shipper was told the mirror holds of the ledger


def mirror_root(host: Host) -> Path:
    return Path(settings.EVIDENCE_MIRROR_ROOT) / host.name


def parts_root() -> Path:
    """Beside the hosts' folders, never inside a runs root the importer reads (a dot name is no host's)."""
    return Path(settings.EVIDENCE_MIRROR_ROOT) / ".parts"


def _parts_dir(host: Host, run_id: str) -> Path:
    return parts_root() / host.name / run_id


# --- what a push says ------------------------------------------------------------------


def _whole_number(value: Any, what: str, upper: int = MAX_OFFSET) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= upper:
        raise ShipError(400, f"{what} is a whole number from 0 to {upper}")
    return value


def parse_push(document: Any) -> Push:
    """A push as the shipper sent it, every item checked (400 with why): nothing is read from
    disk or the database here."""
    if not isinstance(document, dict) or not isinstance(document.get("items"), list):
        raise ShipError(400, "a push is {run_id, generation, items: [...]}")
    run_id = document.get("run_id")
    if not isinstance(run_id, str) or not protocol.valid_run_id(run_id):
        raise ShipError(400, "run_id is not a valid run_id")
    generation = document.get("generation", "")
    if not isinstance(generation, str) or (generation and not protocol.HEX64_RE.fullmatch(generation)):
        raise ShipError(400, "generation is the SHA-256 of the run's steer.json: 64 lowercase hex digits, or empty")
    host_ledger = document.get("ledger_size")
    if host_ledger is not None:
        host_ledger = _whole_number(host_ledger, "ledger_size")
    more = document.get("more", False)
    if not isinstance(more, bool):
        raise ShipError(400, "more is true or false")
    ledger_held = document.get("ledger_held")
    if ledger_held is not None:
        ledger_held = _whole_number(ledger_held, "ledger_held")
    items = document["items"]
    if len(items) > MAX_ITEMS:
        raise ShipError(400, f"at most {MAX_ITEMS} items a push")
    pieces = [_piece(item) for item in items]
    chunked = [piece.path for piece in pieces if piece.kind == FILE and len(piece.data) != piece.size]
    if len(chunked) != len(set(chunked)):
        raise ShipError(400, "one chunk of a file a push: the next goes with the next push")
    ledger = [piece for piece in pieces if piece.kind == LEDGER]
    for before, after in itertools.pairwise(ledger):
        if after.offset != before.offset + len(before.data):
            raise ShipError(400, "the ledger's chunks of a push follow each other: each starts where the last ended")
    return Push(run_id, generation, host_ledger, more, pieces, ledger_held)


def _piece(item: Any) -> Piece:
    if not isinstance(item, dict):
        raise ShipError(400, "each item is an object")
    offset = _whole_number(item.get("offset"), "offset")
    declared = item.get("sha256")
    if not isinstance(declared, str) or not protocol.HEX64_RE.fullmatch(declared):
        raise ShipError(400, "sha256 is 64 lowercase hex digits")
    try:
        data = base64.b64decode(item.get("data", ""), validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise ShipError(400, "data is not base64") from None
    if len(data) > MAX_CHUNK_BYTES:
        raise ShipError(400, f"a chunk is at most {MAX_CHUNK_BYTES} bytes")
    kind = item.get("kind")
    if kind == LEDGER:
        if hashlib.sha256(data).hexdigest() != declared:
            raise ShipError(400, "the ledger bytes do not match their sha256")
        return Piece(LEDGER, offset, data, declared)
    if kind != FILE:
        raise ShipError(400, "kind is ledger or file")
    size = _whole_number(item.get("size"), "size", MAX_JSON_BYTES)
    path = safe_path(item.get("path"))
    if offset + len(data) > size:
        raise ShipError(400, f"{path}: a chunk past the file's size")
    if offset == 0 and len(data) == size and hashlib.sha256(data).hexdigest() != declared:
        raise ShipError(400, f"{path} does not match its sha256")
    return Piece(FILE, offset, data, declared, path, size)


def safe_path(relative: Any) -> str:
    """A run file's path as the shipper names it: steer.json, state.json, or FOLDER/NAME, the
    name one the writer can make (``protocol.valid_record_name``: the shipper skips, and says,
    any other)."""
    if relative in ("steer.json", "state.json"):
        return relative
    if isinstance(relative, str) and relative.count("/") == 1:
        folder, name = relative.split("/")
        if folder in protocol.RUN_FOLDERS and protocol.valid_record_name(name) and name != "..":
            return relative
    raise ShipError(400, "path is steer.json, state.json or FOLDER/NAME in one of the run's folders, the name "
                         "1-255 bytes of UTF-8, no / and no NUL, not starting with a dot")  # fmt: skip


# --- what the mirror holds --------------------------------------------------------------


def _size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return 0


def _read_at(path: Path, offset: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def prefix_digest(path: Path) -> str:
    """The SHA-256 of what the mirror holds at ``path`` (of nothing when it holds nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return protocol.EMPTY_SHA256
    with os.fdopen(fd, "rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def _part_of(host: Host, run_id: str, piece: Piece) -> Path:
    """Where a chunked file's chunks gather: named by its path and the whole's SHA-256, so that a
    file changed on the host between two chunks starts a part of its own."""
    return _parts_dir(host, run_id) / f"{hashlib.sha256(piece.path.encode()).hexdigest()[:32]}-{piece.sha256}.part"


@dataclasses.dataclass
class _Plan:
    """What a push writes once every item of it is checked: bytes to append to the ledger,
    files to put in place, chunks to add to parts (and parts then complete)."""

    ledger_append: bytes = b""
    ledger_from: int = 0
    files: list[Piece] = dataclasses.field(default_factory=list)
    # part, bytes to add at its end, whether it starts afresh, the file it completes (or None), its item
    parts: list[tuple[Path, bytes, bool, Piece | None, int]] = dataclasses.field(default_factory=list)
    held: int = 0  # items the mirror held already

    @property
    def incoming(self) -> int:
        return len(self.ledger_append) + sum(len(p.data) for p in self.files) + sum(len(p[1]) for p in self.parts)


def _diverged(ledger: Path, index: int, why: str) -> ShipError:
    """The 409 that says what the mirror holds; its digest is added outside the push's
    transaction (``_with_digest``), from a cache: a host that sends such pushes again and again
    does not have the server hash a long ledger each time."""
    size = _size(ledger)
    return ShipError(409, f"{why}: the mirror holds {size} bytes of this run's ledger; go on from there when "
                          "this host's ledger starts with them (ledger_sha256)",
                     {"item": index, "ledger_size": size})  # fmt: skip


def _with_digest(host: Host, run_id: str, refused: ShipError) -> None:
    """Add to a 409 the SHA-256 of the mirror's ledger, hashed once for each state of the file
    (its size, time and inode) and kept with the run."""
    ledger = mirror_root(host) / run_id / LEDGER_NAME
    try:
        facts = os.lstat(ledger)
        state = f"{facts.st_size}:{facts.st_mtime_ns}:{facts.st_ino}"
    except FileNotFoundError:
        refused.extra["ledger_sha256"] = protocol.EMPTY_SHA256
        return
    kept = ShippedRun.objects.filter(host=host, run_id=run_id).values_list("ledger_digest_of", "ledger_digest").first()
    if kept is not None and kept[0] == state:
        refused.extra["ledger_sha256"] = kept[1]
        return
    digest = prefix_digest(ledger)
    ShippedRun.objects.filter(host=host, run_id=run_id).update(ledger_digest_of=state, ledger_digest=digest)
    refused.extra["ledger_sha256"] = digest


def _plan(host: Host, run_id: str, run_dir: Path, pieces: list[Piece], ledger_held: int | None = None) -> _Plan:
    """Every item held against what the mirror holds now, nothing written: 409 for one that does
    not follow on from it, with what the shipper needs to go on. A mirror that holds less of the
    ledger than the shipper was told (``ledger_held``: it lost some of the run, a restore from an
    older copy) is a 409 too, whatever the push: the shipper then sends the run again whole. (A
    file that its last chunk completes is checked against its SHA-256 when written, ``_apply``.)"""
    plan = _Plan()
    ledger = run_dir / LEDGER_NAME
    size = _size(ledger)
    if ledger_held is not None and size < ledger_held:
        raise _diverged(ledger, 0, f"the mirror holds less of this run's ledger than the {ledger_held} bytes it "
                                   "took: it lost some of the run")  # fmt: skip
    end = size
    part_ends: dict[Path, int] = {}
    for index, piece in enumerate(pieces):
        if piece.kind == LEDGER:
            if piece.offset > end:
                raise _diverged(ledger, index, f"ledger bytes from {piece.offset}, past the mirror's end")
            held = max(0, min(size, piece.offset + len(piece.data)) - piece.offset)
            if held and _read_at(ledger, piece.offset, held) != piece.data[:held]:
                raise _diverged(ledger, index, f"ledger bytes from {piece.offset} differ from the mirror's")
            if held == len(piece.data):
                plan.held += 1
            elif not plan.ledger_append:
                plan.ledger_from = piece.offset + held
            plan.ledger_append += piece.data[held:]
            end = max(end, piece.offset + len(piece.data))
            continue
        if piece.offset == 0 and len(piece.data) == piece.size:
            plan.files.append(piece)
            continue
        part = _part_of(host, run_id, piece)
        part_size = part_ends.get(part, 0 if piece.offset == 0 else _size(part))
        if piece.offset > part_size:
            raise ShipError(409, f"{piece.path} is shipped from byte {part_size}: send it again from there, or whole",
                            {"item": index, "part_size": part_size})  # fmt: skip
        fresh = piece.offset == 0
        held = 0 if fresh else min(part_size, piece.offset + len(piece.data)) - piece.offset
        if held and _read_at(part, piece.offset, held) != piece.data[:held]:
            raise ShipError(409, f"{piece.path}: a chunk unlike the one the server holds; send the file again",
                            {"item": index, "part_size": 0})  # fmt: skip
        part_ends[part] = max(part_size if not fresh else 0, piece.offset + len(piece.data))
        new = piece.data[held:]
        completes = piece if piece.offset + len(piece.data) == piece.size else None
        if not new and completes is None:
            plan.held += 1
        plan.parts.append((part, new, fresh, completes, index))
    return plan


def _digest_of_file(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def _room_for(run_dir: Path, incoming: int) -> None:
    """507 before a byte is written when the mirror's file system has not room for the push
    (with a margin: a full disk is nobody's mirror)."""
    folder = run_dir if run_dir.exists() else Path(settings.EVIDENCE_MIRROR_ROOT)
    folder.mkdir(parents=True, exist_ok=True)
    facts = os.statvfs(folder)
    free = facts.f_bavail * facts.f_frsize
    if free < incoming + DISK_MARGIN:
        raise ShipError(507, f"the server's disk for the mirror has {free} bytes free: this push of {incoming} "
                             "bytes waits until an operator makes room", {"retry_after": 60})  # fmt: skip


# A push is refused when its bytes would leave less than this free on the mirror's file system.
DISK_MARGIN = 64 * 1024 * 1024


def _apply(host: Host, run_id: str, run_dir: Path, plan: _Plan) -> int:
    """Write what ``_plan`` found to write: the bytes the mirror's copy grew (or shrank) by.

    The parts first, beside the mirror: a file its last chunk completes is checked against its
    SHA-256 (hashed once, as it is written: a host cannot have the server hash a part again
    and again for one upload), and a push whose file does not match is refused (409) with its
    parts put back as they were; only then are files put in place and the ledger appended. A
    write the disk refuses is a 507, and undoes what it can: the parts and the ledger's append
    put back as they were, the files this push made removed (one it replaced stays: the host's
    newer bytes, whole, as a file is put in place)."""
    grown = 0
    undo: list[tuple[Path, int]] = []  # each part written, and its size before (-1: it was not there)
    created: list[Path] = []  # each file this push made (one it replaced stays: the host's newer bytes)
    ledger_from = -1
    try:
        done: list[tuple[Path, Piece]] = []
        for part, new, fresh, completes, index in plan.parts:
            part.parent.mkdir(parents=True, exist_ok=True)
            before = _size(part) if part.exists() else -1
            undo.append((part, before))
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_TRUNC if fresh else os.O_APPEND)
            fd = os.open(part, flags, 0o644)
            try:
                durable.write_all(fd, new)
                if completes is not None:
                    os.fsync(fd)
            finally:
                os.close(fd)
            # A part's bytes count as they arrive; put in place, they are the file's, less the one it replaces.
            grown += len(new) - (max(0, before) if fresh else 0)
            if completes is not None:
                if _size(part) != completes.size or _digest_of_file(part) != completes.sha256:
                    # Not put back: the file comes again from its first chunk, so that a part is
                    # hashed once for each time it is sent whole, never again and again.
                    freed = max(0, before)
                    part.unlink()
                    undo.pop()
                    raise ShipError(409, f"{completes.path}: its chunks do not make the file of its sha256; send it "
                                         "again from its first chunk", {"item": index, "part_size": 0},
                                    freed=freed)  # fmt: skip
                done.append((part, completes))
        run_dir.mkdir(parents=True, exist_ok=True)
        for piece in plan.files:
            target = run_dir / piece.path
            if not os.path.lexists(target):
                created.append(target)
            grown += len(piece.data) - _size(target)
            _put_in_place(host, run_id, piece.path, piece.data, run_dir)
        for part, completes in done:
            target = run_dir / completes.path
            if not os.path.lexists(target):
                created.append(target)
            grown -= _size(target)
            with confined.folder_of(target, run_dir) as (dir_fd, name):
                os.replace(part, name, dst_dir_fd=dir_fd)
                os.fsync(dir_fd)
            undo = [(path, size) for path, size in undo if path != part]
        if plan.ledger_append:
            ledger = run_dir / LEDGER_NAME
            fd = os.open(ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                if os.fstat(fd).st_size != plan.ledger_from:  # only this host's pushes write here, one at a time
                    raise ShipError(409, "the mirror's ledger changed while the push was checked: send it again")
                ledger_from = plan.ledger_from
                durable.write_all(fd, plan.ledger_append)
                os.fsync(fd)
            finally:
                os.close(fd)
            grown += len(plan.ledger_append)
    except (ShipError, OSError) as error:
        _undo(undo, run_dir / LEDGER_NAME, ledger_from)
        for target in created:
            with contextlib.suppress(OSError):
                target.unlink()
        if isinstance(error, ShipError):
            raise
        raise ShipError(507, f"the server could not write the push ({error.strerror or error}): it waits until an "
                             "operator makes room", {"retry_after": 60}) from None  # fmt: skip
    return grown


def _undo(parts: list[tuple[Path, int]], ledger: Path, ledger_from: int) -> None:
    """Put the parts back as they were before a refused push, and cut the ledger's append."""
    for part, before in parts:
        with contextlib.suppress(OSError):
            if before < 0:
                part.unlink()
            else:
                os.truncate(part, before)
    if ledger_from >= 0:
        with contextlib.suppress(OSError):
            fd = os.open(ledger, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, ledger_from)
                os.fsync(fd)
            finally:
                os.close(fd)


def _put_in_place(host: Host, run_id: str, relative: str, data: bytes, run_dir: Path) -> None:
    """A whole file put in place as a durable write does it (a temp file, fsync, a rename, the
    folder's fsync), its temp file beside the mirror: a name of 255 bytes leaves no room for
    a temp name beside it."""
    scratch = _parts_dir(host, run_id)
    scratch.mkdir(parents=True, exist_ok=True)
    temp = scratch / f"{hashlib.sha256(relative.encode()).hexdigest()[:32]}.{os.getpid()}.whole"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        durable.write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        with confined.folder_of(run_dir / relative, run_dir) as (dir_fd, name):
            os.replace(temp, name, dst_dir_fd=dir_fd)
            os.fsync(dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise


# --- a push ----------------------------------------------------------------------------


def push(host: Host, document: Any, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """Store what the host shipped of one run in its mirror, idempotently (the module's rules).
    A refusal is recorded on the host (and on the run, when the server knows it) before it is
    said: a path refused on every pass is stuck, and somebody is told."""
    now = now or protocol.utc_now()
    run_id = document.get("run_id") if isinstance(document, dict) else None
    try:
        _take_a_push(host, now)  # committed whatever becomes of the push: a refused one counts too
        return _push(host, parse_push(document), now)
    except ShipError as refused:
        if "ledger_size" in refused.extra and isinstance(run_id, str):
            _with_digest(host, run_id, refused)
        if refused.freed and isinstance(run_id, str):
            ShippedRun.objects.filter(host=host, run_id=run_id).update(
                mirror_bytes=Greatest(F("mirror_bytes") - refused.freed, 0)
            )
        record_refusal(host, run_id if isinstance(run_id, str) else "", refused, now)
        raise


def _push(host: Host, shipped: Push, now: dt.datetime) -> dict[str, Any]:
    run_dir = mirror_root(host) / shipped.run_id
    with transaction.atomic():
        Host.objects.select_for_update().get(pk=host.pk)  # one push of a host at a time
        owner = Run.objects.filter(run_id=shipped.run_id).exclude(host=host).values_list("host__name", flat=True)
        if (owned_by := owner.first()) is not None:
            raise ShipError(409, f"run_id {shipped.run_id} is already host {owned_by}'s run: this copy is not imported",
                            {"owned_by": owned_by})  # fmt: skip
        archived = Run.objects.filter(run_id=shipped.run_id, host=host, archived=True)
        if shipped.generation and archived.filter(steer_sha256=shipped.generation).exists():
            raise ShipError(410, f"run {shipped.run_id} is archived: the dashboard takes nothing more of it",
                            {"archived": True})  # fmt: skip
        record = ShippedRun.objects.filter(host=host, run_id=shipped.run_id).first()
        if record is None:
            _may_start_a_run(host, now)
        elif shipped.generation and record.generation and shipped.generation != record.generation:
            if os.path.lexists(run_dir):
                raise ShipError(409, f"run_id {shipped.run_id} is another run on this host now (its steer.json "
                                     "differs) and the mirror still holds the old one: rename the new run, or "
                                     "archive the old one first", {"generation": record.generation})  # fmt: skip
            record.generation, record.mirror_ledger_bytes, record.mirror_bytes = shipped.generation, 0, 0
        plan = _plan(host, shipped.run_id, run_dir, shipped.pieces, shipped.ledger_held)
        _within_quota(host, plan.incoming)
        writes = bool(plan.files or plan.parts or plan.ledger_append)  # an empty file is a write too
        if writes:
            _room_for(run_dir, plan.incoming)
        grown = _apply(host, shipped.run_id, run_dir, plan) if writes else 0
        if record is None:
            record = ShippedRun(host=host, run_id=shipped.run_id, created_at=now, reported_at=now)
        record.generation = record.generation or shipped.generation
        record.mirror_ledger_bytes = _size(run_dir / LEDGER_NAME)
        record.mirror_bytes = max(0, record.mirror_bytes + grown)
        if shipped.host_ledger_bytes is not None:
            record.host_ledger_bytes = shipped.host_ledger_bytes
        record.host_ledger_bytes = max(record.host_ledger_bytes, record.mirror_ledger_bytes)
        record.reported_at, record.arriving = now, shipped.more
        if grown:
            record.received_at = now
        _judge_behind(record, now, progressed=bool(grown))
        record.save()  # its problem stays the shipper's to clear: a run can ship with a file it cannot send
        Host.objects.filter(pk=host.pk).update(push_refused_since=None, push_refusal="")
    return {"ledger_size": record.mirror_ledger_bytes, "held": plan.held, "written": grown}


def _judge_behind(record: ShippedRun, now: dt.datetime, *, progressed: bool) -> None:
    """A run short of its host's ledger is behind since now, or since it last made progress."""
    if record.host_ledger_bytes <= record.mirror_ledger_bytes:
        record.behind_since = None
    elif progressed or record.behind_since is None:
        record.behind_since = now


def _take_a_push(host: Host, now: dt.datetime, *, cost: int = 1) -> None:
    """``cost`` pushes of the host's bucket (``EVIDENCE_SHIP_PUSHES_PER_MINUTE``; 429 and when to
    try again when it has not that many), under its row's lock, in a transaction of its own."""
    rate = settings.EVIDENCE_SHIP_PUSHES_PER_MINUTE
    if not rate:
        return
    cost = min(cost, rate)  # a bucket holds a minute's worth: a cost past it would never be met
    with transaction.atomic():
        held = Host.objects.select_for_update().get(pk=host.pk)
        elapsed = (now - held.push_tokens_at).total_seconds() if held.push_tokens_at else 60.0
        tokens = min(float(rate), held.push_tokens + max(0.0, elapsed) * rate / 60.0)
        if tokens >= cost:
            Host.objects.filter(pk=host.pk).update(push_tokens=tokens - cost, push_tokens_at=now)
            return
    wait = (cost - tokens) * 60.0 / rate
    raise ShipError(429, f"host {host.name} pushed more than EVIDENCE_SHIP_PUSHES_PER_MINUTE ({rate}) allows: "
                         f"try again in {wait:.1f} s", {"retry_after": round(wait, 3), "bound": "pushes"})  # fmt: skip


def _may_start_a_run(host: Host, now: dt.datetime) -> None:
    limit = settings.EVIDENCE_SHIP_NEW_RUNS_PER_HOUR
    if limit and ShippedRun.objects.filter(host=host, created_at__gt=now - dt.timedelta(hours=1)).count() >= limit:
        raise ShipError(429, f"host {host.name} started shipping {limit} runs in the last hour, what "
                             "EVIDENCE_SHIP_NEW_RUNS_PER_HOUR allows: this one waits",
                        {"retry_after": 60, "bound": "new_runs"})  # fmt: skip


def host_bytes(host: Host) -> int:
    """What the host's folder of the mirror holds, as its pushes counted it."""
    return ShippedRun.objects.filter(host=host).aggregate(total=Sum("mirror_bytes"))["total"] or 0


def _within_quota(host: Host, incoming: int) -> None:
    quota = settings.EVIDENCE_SHIP_QUOTA_MIB * 1024 * 1024
    if not quota or not incoming:
        return
    used = host_bytes(host)
    if used + incoming > quota:
        raise ShipError(507, f"host {host.name}'s mirror holds {used} bytes of its EVIDENCE_SHIP_QUOTA_MIB "
                             f"({settings.EVIDENCE_SHIP_QUOTA_MIB} MiB): this push of {incoming} bytes is refused "
                             "until retention archives some of its runs or the quota grows",
                        {"used_bytes": used, "quota_bytes": quota})  # fmt: skip


def record_refusal(host: Host, run_id: str, refused: ShipError, now: dt.datetime) -> None:
    """A refused push, kept where a person looks: on the host, refused since when (until a push
    is taken) and why. What it means for the run its shipper says at the end of its pass (a
    ``problem`` in its report): the shipper holds the run back, or goes on from the mirror's end."""
    said = f"{run_id or '?'}: {refused.message}"[:2000]
    Host.objects.filter(pk=host.pk, push_refused_since__isnull=True).update(push_refused_since=now)
    Host.objects.filter(pk=host.pk).update(push_refusal=said)


# --- what the shipper says of its runs -------------------------------------------------

MAX_REPORTED = 500


def report(host: Host, document: Any, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """What the host's shipper says of its runs: at the start of a pass, the size of each ledger
    that changed (so that the server knows how far behind the host its mirror is, before the
    pass reaches the run); at its end, why a run could not be sent (``problem``, "" once it can),
    the runs gone from its root (``gone``), and how long the pass took (``pass_seconds``). A run
    new to the server is counted against its new runs an hour."""
    now = now or protocol.utc_now()
    if not isinstance(document, dict) or not isinstance(document.get("runs", []), list):
        raise ShipError(400, "a report is {runs: [{run_id, generation, ledger_size, problem, gone}], pass_seconds}")
    runs = document.get("runs", [])
    if len(runs) > MAX_REPORTED:
        raise ShipError(400, f"at most {MAX_REPORTED} runs a report")
    pass_seconds = document.get("pass_seconds")
    if pass_seconds is not None and (isinstance(pass_seconds, bool) or not isinstance(pass_seconds, int | float)
                                     or not 0 <= pass_seconds <= 86400):  # fmt: skip
        raise ShipError(400, "pass_seconds is a number of seconds from 0 to 86400")
    said = [_reported(entry) for entry in runs]
    _take_a_push(host, now, cost=1 + len(said) // 50)  # a report of many runs weighs as pushes do
    taken = 0
    with transaction.atomic():
        # The host's row first, as a push locks it: a push and a report of one new run at once
        # would otherwise each wait for the other's row.
        Host.objects.select_for_update().get(pk=host.pk)
        for run_id, generation, ledger_size, problem, gone in said:
            taken += _take_report(host, run_id, generation, ledger_size, problem, gone, now)
    if pass_seconds is not None:  # the shipper's pass ended: how long it took, as a watch's does
        Host.objects.filter(pk=host.pk).update(last_pass_seconds=pass_seconds)
    return {"taken": taken}


def _take_report(host: Host, run_id: str, generation: str, ledger_size: int | None, problem: str | None, gone: bool,
                 now: dt.datetime) -> int:  # fmt: skip
    """One run of a report, kept on its ``ShippedRun``: 1 when taken."""
    if gone:  # no longer under the host's root: nothing of it is behind, nothing is wrong with it
        return ShippedRun.objects.filter(host=host, run_id=run_id).update(
            host_ledger_bytes=F("mirror_ledger_bytes"), behind_since=None, arriving=False, problem="",
            problem_since=None, reported_at=now,
        )  # fmt: skip
    record = ShippedRun.objects.select_for_update().filter(host=host, run_id=run_id).first()
    if record is None:
        try:
            _may_start_a_run(host, now)
        except ShipError:
            return 0
        record = ShippedRun(host=host, run_id=run_id, generation=generation, created_at=now, reported_at=now)
    elif generation and record.generation and generation != record.generation:
        if os.path.lexists(mirror_root(host) / run_id):
            # Another run under the id of one the mirror holds: its sizes are not the mirror's
            # run's, but why it cannot be sent is (a run refused on every pass is stuck).
            _said_problem(record, problem, now)
            record.reported_at = now
            record.save()
            return 1
        record.generation, record.mirror_ledger_bytes, record.mirror_bytes = generation, 0, 0
    record.generation = record.generation or generation
    record.reported_at = now
    if ledger_size is not None:
        record.host_ledger_bytes = ledger_size
        if ledger_size <= record.mirror_ledger_bytes:
            record.arriving = False
    _judge_behind(record, now, progressed=False)
    _said_problem(record, problem, now)
    record.save()
    return 1


def _said_problem(record: ShippedRun, problem: str | None, now: dt.datetime) -> None:
    """Why the run cannot be sent, as its shipper says it (None: it said nothing of it)."""
    if problem is None:
        return
    if problem and not record.problem:
        record.problem_since = now
    record.problem, record.problem_since = problem, record.problem_since if problem else None


def _reported(entry: Any) -> tuple[str, str, int | None, str | None, bool]:
    if not isinstance(entry, dict):
        raise ShipError(400, "each run of a report is an object")
    run_id, generation = entry.get("run_id"), entry.get("generation", "")
    if not isinstance(run_id, str) or not protocol.valid_run_id(run_id):
        raise ShipError(400, "run_id is not a valid run_id")
    if not isinstance(generation, str) or (generation and not protocol.HEX64_RE.fullmatch(generation)):
        raise ShipError(400, "generation is 64 lowercase hex digits, or empty")
    size = entry.get("ledger_size")
    problem = entry.get("problem")
    if problem is not None and not isinstance(problem, str):
        raise ShipError(400, "problem is a sentence, or empty once the run ships")
    gone = entry.get("gone", False)
    if not isinstance(gone, bool):
        raise ShipError(400, "gone is true or false")
    return (run_id, generation, None if size is None else _whole_number(size, "ledger_size"),
            None if problem is None else problem[:2000], gone)  # fmt: skip


# --- what the importer waits for --------------------------------------------------------


def arriving(host: Host, now: dt.datetime | None = None) -> set[str]:
    """The runs of ``host`` whose shipper is between two pushes of one pass (it said more
    follow), lately: the importer leaves them until the last, so that a run is never read half
    arrived (a receipt whose ledger line is still on its way). A shipper that died between them
    stops holding the run back after ``EVIDENCE_HOST_SILENT_AFTER_SECONDS``."""
    now = now or protocol.utc_now()
    recent = now - dt.timedelta(seconds=settings.EVIDENCE_HOST_SILENT_AFTER_SECONDS)
    rows = ShippedRun.objects.filter(host=host, arriving=True, reported_at__gte=recent)
    return set(rows.values_list("run_id", flat=True))


def sweep_parts(now: dt.datetime | None = None) -> list[Path]:
    """Remove the parts whose last chunk has not come for ``EVIDENCE_SHIP_PARTS_KEEP_SECONDS``
    (their shipper died or moved on: the file starts again from its first chunk), and the
    folders left empty; their bytes no longer count against their host's quota."""
    now = now or protocol.utc_now()
    limit = now.timestamp() - settings.EVIDENCE_SHIP_PARTS_KEEP_SECONDS
    removed: list[Path] = []
    root = parts_root()
    if not root.is_dir():
        return removed
    for host_dir in _folders(root):
        for run_dir in _folders(host_dir):
            freed = 0
            for entry in list(os.scandir(run_dir)):
                with contextlib.suppress(FileNotFoundError):
                    info = entry.stat(follow_symlinks=False)
                    if not entry.is_file(follow_symlinks=False) or info.st_mtime < limit:
                        if entry.is_dir(follow_symlinks=False):
                            shutil.rmtree(entry.path)
                        else:
                            os.unlink(entry.path)
                        freed += info.st_size
                        removed.append(Path(entry.path))
            if freed:
                ShippedRun.objects.filter(host__name=host_dir.name, run_id=run_dir.name).update(
                    mirror_bytes=F("mirror_bytes") - freed
                )
            with contextlib.suppress(OSError):
                run_dir.rmdir()
        with contextlib.suppress(OSError):
            host_dir.rmdir()
    return removed


def _folders(path: Path) -> list[Path]:
    with os.scandir(path) as listing:
        return [Path(entry.path) for entry in listing if entry.is_dir(follow_symlinks=False)]
