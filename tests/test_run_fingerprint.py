"""A run's fingerprint, taken as its folders are listed: the same digest whatever the number of
files and however it is cut into chunks or set aside on disk, and memory that does not grow
with the number of receipts."""

from __future__ import annotations

import array
import hashlib
import os
import tracemalloc
from pathlib import Path

import pytest

from receipts.protocol import LEDGER_NAME, RUN_FOLDERS
from receipts.reader import discovery, run_fingerprint
from receipts.reader.safe_open import signature_from


def _run(path: Path, receipts: int, confirmations: int = 2) -> Path:
    for folder in RUN_FOLDERS:
        (path / folder).mkdir(parents=True)
    (path / "steer.json").write_text("{}")
    (path / LEDGER_NAME).write_text("")
    for index in range(receipts):
        (path / "receipts" / f"{index:064x}.json").write_text("{}")
    for index in range(confirmations):
        (path / "confirmations" / f"{index:064x}.json").write_text("{}")
    return path


def _digest_as_documented(run_dir: Path) -> str:
    """Every name joined by NUL, then five numbers per counted name (-1 each when missing): the
    format stored fingerprints were taken in, listed whole in one go."""
    names: list[str] = []
    numbers = array.array("q")

    def count(path: Path) -> None:
        try:
            info = os.lstat(path)
        except OSError:
            numbers.extend((-1,) * 5)
            return
        numbers.extend((info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino))

    for name in ("state.json", "steer.json", LEDGER_NAME, *RUN_FOLDERS):
        names.append(name)
        count(run_dir / name)
    for folder in RUN_FOLDERS:
        names.append(f"{folder}/")
        if not (run_dir / folder).is_dir():
            continue
        for entry in os.scandir(run_dir / folder):
            names.append(entry.name)
            count(Path(entry.path))
    digest = hashlib.sha256("\0".join(names).encode("utf-8", "surrogateescape"))
    digest.update(numbers.tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_the_fingerprint_is_the_documented_digest_however_it_is_cut_and_set_aside(tmp_path, monkeypatch, chunk):
    run_dir = _run(tmp_path / "run", receipts=50)
    (run_dir / "confirmations").rename(run_dir / "gone")  # a folder missing: a name, no numbers
    os.symlink("elsewhere", run_dir / "receipts" / "dangling.json")
    monkeypatch.setattr(discovery, "_FINGERPRINT_CHUNK", chunk)
    monkeypatch.setattr(discovery, "FINGERPRINT_NUMBERS_IN_MEMORY", 64)  # on disk after two files
    signatures: dict[str, str] = {}
    assert run_fingerprint(run_dir, signatures) == _digest_as_documented(run_dir)
    receipts = {entry.name: entry for entry in os.scandir(run_dir / "receipts")}
    assert signatures == {name: signature_from(entry.stat(follow_symlinks=False)) for name, entry in receipts.items()}


def test_a_change_to_one_file_among_many_changes_the_fingerprint(tmp_path, monkeypatch):
    run_dir = _run(tmp_path / "run", receipts=300)
    monkeypatch.setattr(discovery, "_FINGERPRINT_CHUNK", 16)
    monkeypatch.setattr(discovery, "FINGERPRINT_NUMBERS_IN_MEMORY", 0)
    confirmations: set[str] = set()
    before = run_fingerprint(run_dir, None, confirmations)
    assert confirmations == {f"{index:064x}.json" for index in range(2)}
    assert run_fingerprint(run_dir) == before
    (run_dir / "receipts" / f"{299:064x}.json").write_text("[]")  # the last chunk, the same size
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
    monkeypatch.setattr(discovery, "FINGERPRINT_NUMBERS_IN_MEMORY", 64 * 1024)
    few, many = _run(tmp_path / "few", receipts=1_000), _run(tmp_path / "many", receipts=10_000)
    _peak_bytes(few)  # what a first call allocates once (imports, caches) is not counted
    assert _peak_bytes(many) < 1.5 * _peak_bytes(few) + 64 * 1024
