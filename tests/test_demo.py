"""The demo runs: written by the real writer, each showing what it promises."""

from __future__ import annotations

import json

import pytest

from receipts.demo import SCENARIOS, write_demo_runs
from tests.ledger import events_of, read_ledger


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    assert write_demo_runs(root) == list(SCENARIOS)
    return root


def test_every_demo_ledger_is_a_clean_chain(demo_root):
    for run_id in SCENARIOS:
        assert read_ledger(demo_root / run_id)


def test_writing_the_demo_again_keeps_what_is_there(demo_root):
    before = (demo_root / "clean-run" / "events.jsonl").read_bytes()
    assert write_demo_runs(demo_root) == []
    assert (demo_root / "clean-run" / "events.jsonl").read_bytes() == before


def dispositions(demo_root, run_id):
    return [event["disposition"] for event in events_of(demo_root / run_id, "submission")]


def test_demo_a2_retry_reuses_and_a4_creates_once(demo_root):
    # The killed process committed the task but never wrote its event: the retry recovers it.
    assert dispositions(demo_root, "a2-lost-response") == ["created", "reused"]
    [created, _] = events_of(demo_root / "a2-lost-response", "submission")
    assert created["recovered"] is True and created["created_at"]
    assert sorted(dispositions(demo_root, "a4-concurrent")) == ["created"] + ["reused"] * 7
    for run_id in ("a2-lost-response", "a4-concurrent"):
        assert len(list((demo_root / run_id / "tasks").iterdir())) == 1


def test_demo_conflict_and_legacy(demo_root):
    assert dispositions(demo_root, "conflict-same-id") == ["created", "conflict"]
    assert dispositions(demo_root, "legacy-task") == ["created", "created"]


def test_demo_killed_calls_are_left_in_doubt(demo_root):
    for run_id in ("send-message-killed", "write-file-killed"):
        [receipt] = (demo_root / run_id / "receipts").iterdir()
        assert json.loads(receipt.read_bytes())["status"] == "prepared"
    outbox = (demo_root / "send-message-killed" / "outbox.jsonl").read_bytes()
    assert len(outbox.splitlines()) == 1


def test_demo_stale_reservation_is_reserved_two_hours_ago(demo_root):
    [record] = (demo_root / "stale-reservation" / "submissions").iterdir()
    record = json.loads(record.read_bytes())
    assert record["state"] == "reserved"
    assert (demo_root / "stale-reservation" / record["task_path"]).exists()
