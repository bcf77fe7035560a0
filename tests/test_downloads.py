"""The CSV and JSON twins, byte for byte, over a small run written by the writer at a fixed time."""

from __future__ import annotations

from pathlib import Path

import pytest

from evidence.ingest import importer
from receipts import protocol, runtime
from tests.helpers import CONTRACT, content, data_path

pytestmark = pytest.mark.django_db

FIXED_TIME = "2026-11-30T12:00:00Z"


@pytest.fixture
def fixed_run(tmp_path: Path, monkeypatch) -> Path:
    """A run with every byte fixed: the writer's clock is pinned, and no tool it calls is random."""
    monkeypatch.setenv("RECEIPTS_CLOCK", FIXED_TIME)
    run_dir = tmp_path / "fixed-run"
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    executor = runtime.Executor(run_dir)
    executor.call("write_file", {"path": "a.txt", "content": "=1+1"})
    executor.call("write_file", {"path": "a.txt", "content": "=1+1"})
    runtime.write_task(run_dir, {"subject": 'Fix, "quoted"\nlogin', "priority": "P1"}, "sub-1")
    runtime.run_set_state(run_dir, state="finished", attempts=1)
    importer.run_import(path=run_dir, now=protocol.parse_time(FIXED_TIME))
    return run_dir


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_the_ledger_download_is_byte_for_byte_what_it_was(logged_in, fixed_run, fmt):
    response = logged_in.get(f"/runs/fixed-run/?list=events&format={fmt}")
    assert response["Content-Disposition"] == f'attachment; filename="fixed-run-events.{fmt}"'
    assert content(response).encode() == data_path("downloads", f"fixed-run-events.{fmt}").read_bytes()


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_the_calls_download_is_byte_for_byte_what_it_was(logged_in, fixed_run, fmt):
    response = logged_in.get(f"/runs/fixed-run/?list=calls&format={fmt}")
    assert content(response).encode() == data_path("downloads", f"fixed-run-calls.{fmt}").read_bytes()
