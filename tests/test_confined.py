"""The one confined open (receipts.confined): the writer and the reader refuse a planted name with
the same exception, each saying it in its own way, and the read-only mode never writes."""

from __future__ import annotations

import os

import pytest

from receipts import confined, durable, runtime
from receipts.findings import Sentence
from receipts.reader import read_ledger
from tests.helpers import CONTRACT


def test_a_symlinked_ledger_is_one_refusal_said_to_a_person_and_as_a_finding(tmp_path):
    run_dir = tmp_path / "run"
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes(b"")
    (run_dir / "events.jsonl").unlink()
    (run_dir / "events.jsonl").symlink_to(elsewhere)
    with pytest.raises(confined.UnsafePath) as refused:
        durable.append_event(run_dir, "note", {})
    # The writer's message names the file for the person who ran it; nothing was written through.
    assert "events.jsonl is a symlink" in str(refused.value) and elsewhere.read_bytes() == b""
    [batch] = list(read_ledger(run_dir, None))
    [finding] = batch.findings
    assert (finding.code, finding.subject, finding.detail) == ("unsafe_path", "events.jsonl", "a symlink: not followed")


def test_the_read_only_mode_makes_no_folder_and_opens_nothing_for_writing(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(FileNotFoundError):
            confined.open_folder("receipts", fd)
        assert not (run_dir / "receipts").exists()
        with pytest.raises(ValueError, match="read-only open"):
            confined.open_regular("state.json", fd, confined.READ, os.O_WRONLY | os.O_CREAT)
        assert not (run_dir / "state.json").exists()
        os.close(confined.open_folder("receipts", fd, confined.WRITE))
        assert (run_dir / "receipts").is_dir()
    finally:
        os.close(fd)


def test_a_fifo_is_refused_in_both_modes_without_waiting_for_a_writer(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for mode, flags in ((confined.READ, os.O_RDONLY), (confined.WRITE, os.O_RDWR)):
            with pytest.raises(confined.UnsafePath) as refused:
                confined.open_regular("pipe", fd, mode, flags)
            assert refused.value.detail == Sentence("unsafe_path.not_regular") and "pipe" in str(refused.value)
    finally:
        os.close(fd)
