"""Recovery decisions: the rule, and the command over real run directories."""

from __future__ import annotations

import json

import pytest

from receipts.demo import run_writer
from receipts.recovery import decide


@pytest.mark.parametrize(
    ("facts", "decision"),
    [
        ({"status": "committed"}, "reuse"),
        ({"status": "prepared", "confirmation": "committed"}, "reuse"),
        ({"status": "unknown", "confirmation": "rejected"}, "retry"),
        ({"status": "rejected", "error_kind": "retryable"}, "retry"),
        ({"status": "rejected", "error_kind": "permanent"}, "stop"),
        ({"status": "rejected", "error_kind": None}, "stop"),
        ({"status": "prepared", "queryable": True}, "query"),
        ({"status": "unknown", "queryable": True}, "query"),
        ({"status": "prepared"}, "confirm"),
        ({"status": "unknown"}, "confirm"),
        ({"status": "failed"}, "confirm"),
        ({"status": None}, "confirm"),
        ({"status": "weird"}, "confirm"),
        ({"status": "committed", "verification": "mismatch"}, "confirm"),
        ({"status": "committed", "verification": "unverifiable"}, "confirm"),
        ({"status": "prepared", "queryable": True, "verification": "mismatch"}, "confirm"),
        ({"status": "rejected", "error_kind": "retryable", "verification": "unverifiable"}, "confirm"),
    ],
)
def test_decide(facts, decision):
    result = decide(**facts)
    assert result.decision == decision
    assert result.reason


def test_replay_json_over_the_demo_runs(tmp_path):
    assert run_writer("demo", str(tmp_path)).returncode == 0
    by_run = {}
    for run in sorted(tmp_path.iterdir()):
        completed = run_writer("replay", str(run), "--json")
        assert completed.returncode == 0
        report = json.loads(completed.stdout)
        assert report["run_id"] == run.name
        for row in report["decisions"]:
            assert set(row) == {"call_id", "status", "decision", "reason"}
        by_run[run.name] = [row["decision"] for row in report["decisions"]]
    assert by_run["clean-run"] == ["reuse", "reuse", "reuse"]
    assert by_run["send-message-killed"] == ["confirm"]
    assert by_run["write-file-killed"] == ["query"]


def test_replay_has_no_side_effect(tmp_path):
    run_writer("demo", str(tmp_path))
    run = tmp_path / "write-file-killed"
    before = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    run_writer("replay", str(run), "--json")
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == before


def test_replay_names_a_call_whose_receipt_is_missing(tmp_path):
    run_writer("demo", str(tmp_path))
    run = tmp_path / "clean-run"
    victim = sorted((run / "receipts").iterdir())[0]
    victim.unlink()
    report = json.loads(run_writer("replay", str(run), "--json").stdout)
    missing = [row for row in report["decisions"] if row["call_id"] == victim.stem]
    assert missing == [{"call_id": victim.stem, "status": None, "decision": "confirm", "reason": missing[0]["reason"]}]


@pytest.mark.parametrize("damage", ["oversize", "invalid_json", "schema_error"])
def test_replay_names_a_call_whose_receipt_cannot_be_read(tmp_path, damage):
    """A receipt over the reader's 16 MiB, or not JSON, or not a receipt, gave no decision at all:
    replay said nothing of the call. It is a person's to decide, as a missing receipt is."""
    run_writer("demo", str(tmp_path))
    run = tmp_path / "clean-run"
    victim = sorted((run / "receipts").iterdir())[0]
    if damage == "oversize":
        receipt = json.loads(victim.read_bytes())
        victim.write_text(json.dumps(receipt | {"padding": "x" * (16 * 1024 * 1024)}))
    else:
        victim.write_text("{not json" if damage == "invalid_json" else "[1, 2]")
    report = json.loads(run_writer("replay", str(run), "--json").stdout)
    [row] = [row for row in report["decisions"] if row["call_id"] == victim.stem]
    assert row["status"] is None and row["decision"] == "confirm"
    assert f"its receipt file cannot be read ({damage}" in row["reason"]
    assert len(report["decisions"]) == len(list((run / "receipts").iterdir())), "the other calls are decided too"
