"""An independent check of a ledger, straight from the spec's formulas."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def read_ledger(run_dir: Path) -> list[dict]:
    """Every event; asserts seq 1..N without gaps and an intact hash chain."""
    data = (run_dir / "events.jsonl").read_bytes()
    assert data == b"" or data.endswith(b"\n"), "the ledger ends in a torn line"
    events, previous = [], "0" * 64
    for number, line in enumerate(data.splitlines(), start=1):
        event = json.loads(line)
        assert event["seq"] == number, f"seq {event['seq']} at line {number}"
        assert event["prev_sha256"] == previous, f"chain broken at line {number}"
        previous = hashlib.sha256(line).hexdigest()
        events.append(event)
    return events


def events_of(run_dir: Path, event_type: str) -> list[dict]:
    return [event for event in read_ledger(run_dir) if event["type"] == event_type]
