"""A run's fingerprint, taken as its folders are listed, by parts: the same digest whatever the
number of files and however it is cut into chunks, memory that does not grow with the number
of receipts, and the same digest again when the run is listed again by names and inodes after
any change the writer makes (a file added, put in place by a rename, or removed), with only
the changed parts' files stat-ed."""

from __future__ import annotations

import hashlib
import os
import random
import struct
import tracemalloc
import zlib
from pathlib import Path

import pytest

from receipts.protocol import LEDGER_NAME, RUN_FOLDERS
from receipts.reader import discovery, list_run, receipt_bucket, relist_run, run_fingerprint
from receipts.reader.safe_open import signature_from


def _receipt_name(index: int) -> str:
    """A call id's file name: a hex digest, as the writer names them (so they fall in many buckets)."""
    return hashlib.sha256(str(index).encode()).hexdigest() + ".json"


def _run(path: Path, receipts: int, confirmations: int = 2) -> Path:
    for folder in RUN_FOLDERS:
        (path / folder).mkdir(parents=True)
    (path / "steer.json").write_text("{}")
    (path / LEDGER_NAME).write_text("")
    for index in range(receipts):
        (path / "receipts" / _receipt_name(index)).write_text("{}")
    for index in range(confirmations):
        (path / "confirmations" / _receipt_name(index)).write_text("{}")
    return path


def _digest_as_documented(run_dir: Path) -> str:
    """The format stored fingerprints are taken in, from a listing of each folder whole: the
    five numbers of the run's own files and folders (-1 each when missing), then each folder's
    parts in order, each its files' count and the sum of their SHA-256 (name, NUL, numbers)."""

    def numbers(path: Path) -> tuple[int, ...]:
        try:
            info = os.lstat(path)
        except OSError:
            return (-1,) * 5
        return (info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)

    digest = hashlib.sha256(b"callproof run fingerprint 2\n")
    for name in ("state.json", "steer.json", LEDGER_NAME, *RUN_FOLDERS):
        digest.update(struct.pack("=5q", *numbers(run_dir / name)))
    for folder in RUN_FOLDERS:
        if not (run_dir / folder).is_dir():
            digest.update(f"{folder}/ not listed\n".encode())
            continue
        digest.update(f"{folder}/\n".encode())
        parts: dict[str, list[int]] = {}
        for name in os.listdir(run_dir / folder):
            raw = name.encode("utf-8", "surrogateescape")
            key = name.removesuffix(".json")[:2] if folder == "receipts" else f"#{zlib.crc32(raw) & 0xFF:02x}"
            file_digest = hashlib.sha256(raw + b"\0" + struct.pack("<5q", *numbers(run_dir / folder / name)))
            part = parts.setdefault(key, [0, 0])
            part[0] += 1
            part[1] += int.from_bytes(file_digest.digest())
        for key in sorted(parts):
            count, total = parts[key]
            digest.update(f"{key}\0{count}\0{total % (1 << 256):064x}\n".encode())
    return digest.hexdigest()


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_the_fingerprint_is_the_documented_digest_however_it_is_cut(tmp_path, monkeypatch, chunk):
    run_dir = _run(tmp_path / "run", receipts=50)
    (run_dir / "confirmations").rename(run_dir / "gone")  # a folder missing: said, no parts
    os.symlink("elsewhere", run_dir / "receipts" / "dangling.json")
    (run_dir / "tasks" / "TASK-000001.md").write_text("a task")
    monkeypatch.setattr(discovery, "_FINGERPRINT_CHUNK", chunk)
    signatures: dict[str, str] = {}
    assert run_fingerprint(run_dir, signatures) == _digest_as_documented(run_dir)
    receipts = {entry.name: entry for entry in os.scandir(run_dir / "receipts")}
    assert signatures == {name: signature_from(entry.stat(follow_symlinks=False)) for name, entry in receipts.items()}


def test_a_change_to_one_file_among_many_changes_the_fingerprint(tmp_path, monkeypatch):
    run_dir = _run(tmp_path / "run", receipts=300)
    monkeypatch.setattr(discovery, "_FINGERPRINT_CHUNK", 16)
    confirmations: set[str] = set()
    before = run_fingerprint(run_dir, None, confirmations)
    assert confirmations == {_receipt_name(index) for index in range(2)}
    assert run_fingerprint(run_dir) == before
    (run_dir / "receipts" / _receipt_name(299)).write_text("[]")  # the same size, the same inode
    assert run_fingerprint(run_dir) != before


def _peak_bytes(run_dir: Path) -> int:
    tracemalloc.start()
    try:
        run_fingerprint(run_dir)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_fingerprint_of_many_receipts_holds_no_more_memory_than_of_a_few(tmp_path, monkeypatch):
    # Listed whole, 10,000 entries held some 3 MB of names and directory entries at once.
    monkeypatch.setattr(discovery, "_FINGERPRINT_CHUNK", 256)
    few, many = _run(tmp_path / "few", receipts=1_000), _run(tmp_path / "many", receipts=10_000)
    _peak_bytes(few)  # what a first call allocates once (imports, caches) is not counted
    assert _peak_bytes(many) < 1.5 * _peak_bytes(few) + 64 * 1024


# --- listed again by names and inodes ----------------------------------------------------


def _relist(run_dir: Path, before: discovery.RunParts) -> tuple[discovery.RunParts, set[str] | None, dict, set]:
    signatures: dict[str, str] = {}
    confirmations: set[str] = set()
    parts, relisted = relist_run(run_dir, before, signatures, confirmations)
    return parts, relisted, signatures, confirmations


def _put_in_place(path: Path, content: str) -> None:
    """As the writer puts a file in place: written beside it, then renamed over it."""
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(content)
    os.replace(temp, path)


def test_a_run_listed_again_unchanged_stats_no_file_and_has_the_same_fingerprint(tmp_path, monkeypatch):
    run_dir = _run(tmp_path / "run", receipts=500)
    before = list_run(run_dir)
    stat_ed: list[str] = []
    real = discovery._add_stat_ed

    def counted(folder: str, entries: list, *rest: object) -> None:
        stat_ed.extend(entry.name for entry in entries)
        real(folder, entries, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(discovery, "_add_stat_ed", counted)
    parts, relisted, signatures, confirmations = _relist(run_dir, before)
    assert (parts.fingerprint(), relisted, signatures, stat_ed) == (before.fingerprint(), set(), {}, [])
    assert confirmations == {_receipt_name(index) for index in range(2)}


def test_what_the_writer_changes_is_found_by_the_listing_again_and_only_its_buckets_stat_ed(tmp_path):
    run_dir = _run(tmp_path / "run", receipts=2_000)
    before = list_run(run_dir)
    added, replaced, removed = _receipt_name(5_000), _receipt_name(7), _receipt_name(8)
    _put_in_place(run_dir / "receipts" / added, '{"new": 1}')
    _put_in_place(run_dir / "receipts" / replaced, "{}")  # the same bytes, another inode
    (run_dir / "receipts" / removed).unlink()
    _put_in_place(run_dir / "confirmations" / added, "{}")
    (run_dir / "tasks" / "TASK-000001.md").write_text("a task")
    parts, relisted, signatures, confirmations = _relist(run_dir, before)
    whole: dict[str, str] = {}
    assert parts.fingerprint() == list_run(run_dir, whole).fingerprint() != before.fingerprint()
    buckets = {receipt_bucket(name) for name in (added, replaced, removed)}
    assert relisted == buckets
    assert signatures == {name: signature for name, signature in whole.items() if receipt_bucket(name) in buckets}
    assert added in confirmations and added in signatures and removed not in signatures


def test_an_edit_in_place_is_not_seen_by_the_listing_again_and_is_by_the_whole_one(tmp_path):
    """The trade-off, as the glance's: a file written over (the same inode) is found by the whole
    listing, which a watch takes at least every cold sweep."""
    run_dir = _run(tmp_path / "run", receipts=100)
    before = list_run(run_dir)
    with (run_dir / "receipts" / _receipt_name(3)).open("a") as receipt:
        receipt.write(" ")
    parts, relisted, _, _ = _relist(run_dir, before)
    assert relisted == set()
    assert parts.fingerprint() == before.fingerprint() != list_run(run_dir).fingerprint()


def test_a_folder_whose_entries_changed_with_no_name_or_inode_to_show_it_is_stat_ed_whole(tmp_path):
    """``rm`` then ``cp`` may give a file the inode just freed, and an edit in place beside a
    file made and removed moves the folder's times: no part shows a change, the folder did."""
    run_dir = _run(tmp_path / "run", receipts=100)
    before = list_run(run_dir)
    with (run_dir / "receipts" / _receipt_name(3)).open("a") as receipt:
        receipt.write(" ")
    (run_dir / "receipts" / ".made-and-removed").write_text("")
    (run_dir / "receipts" / ".made-and-removed").unlink()
    parts, relisted, signatures, _ = _relist(run_dir, before)
    assert relisted == {receipt_bucket(_receipt_name(index)) for index in range(100)}
    assert parts.fingerprint() == list_run(run_dir).fingerprint() != before.fingerprint()
    assert len(signatures) == 100


@pytest.mark.parametrize("seed", range(6))
def test_listed_again_after_any_sequence_of_changes_the_fingerprint_is_the_whole_listings(tmp_path, seed):
    """Files added, renamed over, removed, folders removed and made again, in every folder,
    each change followed by a listing again against the one before it."""
    chance = random.Random(seed)
    run_dir = _run(tmp_path / "run", receipts=300)
    parts = list_run(run_dir)
    for step in range(40):
        folder = run_dir / chance.choice(RUN_FOLDERS)
        names = sorted(os.listdir(folder)) if folder.is_dir() else []
        action = chance.choice(["add", "add", "replace", "remove", "folder"])
        if action == "folder":
            if folder.is_dir():
                for name in names:
                    (folder / name).unlink()
                folder.rmdir()
            else:
                folder.mkdir()
        elif not folder.is_dir():
            continue
        elif action == "add" or not names:
            odd = ("a.json", f"é{step}.json", os.fsdecode(b"\xff\xfe%d.json" % step), f"x{step}")
            name = chance.choice([_receipt_name(10_000 + step), *odd])  # short, not ASCII, not UTF-8
            _put_in_place(folder / name, f"step {step}")
        elif action == "replace":
            _put_in_place(folder / chance.choice(names), f"step {step}")
        else:
            (folder / chance.choice(names)).unlink()
        parts, relisted, signatures, _ = _relist(run_dir, parts)
        whole: dict[str, str] = {}
        assert parts.fingerprint() == list_run(run_dir, whole).fingerprint(), (step, action, folder.name)
        covered = whole if relisted is None else {n: s for n, s in whole.items() if receipt_bucket(n) in relisted}
        assert signatures == covered, (step, action, folder.name)
