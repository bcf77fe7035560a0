"""A receipt held against what the ledger recorded of it: a commit is final.

The writer never writes a committed receipt again (a later attempt is another call), so a
receipt that says anything else for a call whose commit the ledger records was changed
after the fact. In an unsigned run nothing else shows it: the identity check covers the
call's inputs, and a rejected receipt needs no outcome digest. Issue 55, case 10.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evidence.ingest import importer
from evidence.models import Call, Finding
from receipts import protocol
from receipts.reader import read_run
from tests.ledger import events_of
from tests.writer import FILE_ARGS, cli_call, decisions, edit_receipt, only_receipt

pytestmark = pytest.mark.django_db


def as_an_attacker_would(receipt: dict, status: str) -> None:
    """Make a committed receipt say ``status``, well formed: what the reader sees of a quiet edit."""
    receipt["status"] = status
    for name in ("result", "output_sha256"):
        receipt.pop(name, None)
    if status == "rejected":
        receipt["error"] = {"kind": "retryable", "message": "the target refused"}


def committed_call(run_dir: Path) -> str:
    assert cli_call(run_dir, "write_file", FILE_ARGS).returncode == 0
    call_id = only_receipt(run_dir)
    assert [event["status"] for event in events_of(run_dir, "receipt")] == ["prepared", "committed"]
    return call_id


@pytest.mark.parametrize("status", ["rejected", "unknown", "prepared"])
def test_a_commit_rewritten_to_another_status_is_a_finding(run_dir, status):
    call_id = committed_call(run_dir)
    files, _ = read_run(run_dir)
    assert files.findings == [], "a clean commit: nothing to say"

    edit_receipt(run_dir, call_id, lambda receipt: as_an_attacker_would(receipt, status))
    files, _ = read_run(run_dir)
    found = [(f.code, f.subject, f.call_id) for f in files.findings]
    assert found == [("receipt_contradicts_ledger", f"receipts/{call_id}.json", call_id)]
    detail = files.findings[0]
    assert f"status {status!r}" in detail.detail and detail.sentence == "receipt_contradicts_ledger.committed"
    assert detail.severity == "error"


def test_the_edit_passes_every_other_check_of_an_unsigned_run(run_dir):
    """Why the finding is needed: the rejected receipt is verified, and replay would retry the call."""
    call_id = committed_call(run_dir)
    edit_receipt(run_dir, call_id, lambda receipt: as_an_attacker_would(receipt, "rejected"))
    files, _ = read_run(run_dir)
    (call,) = files.calls
    assert (call.status, call.verification) == ("rejected", protocol.VERIFIED)
    assert decisions(run_dir)[call_id] == "retry"
    assert {f.code for f in files.findings} == {"receipt_contradicts_ledger"}


def test_the_import_shows_it_and_keeps_it_open_until_the_receipt_says_committed_again(run_dir):
    call_id = committed_call(run_dir)
    importer.run_import(path=run_dir)
    assert not Finding.objects.filter(run__run_id=run_dir.name).exists()
    original = (run_dir / "receipts" / f"{call_id}.json").read_bytes()

    edit_receipt(run_dir, call_id, lambda receipt: as_an_attacker_would(receipt, "rejected"))
    importer.run_import(path=run_dir)  # incremental: the ledger's commit comes from the stored events
    finding = Finding.objects.get(run__run_id=run_dir.name, code="receipt_contradicts_ledger")
    assert (finding.subject, finding.call_id, finding.closed_at) == (f"receipts/{call_id}.json", call_id, None)
    assert Call.objects.get(call_id=call_id).status == "rejected"

    importer.run_import(path=run_dir)  # unchanged files: the finding stays open
    assert Finding.objects.get(pk=finding.pk).closed_at is None
    importer.run_import(path=run_dir, force=True)  # the whole run read again: the same finding, once
    assert Finding.objects.filter(code="receipt_contradicts_ledger", closed_at__isnull=True).count() == 1

    (run_dir / "receipts" / f"{call_id}.json").write_bytes(original)
    importer.run_import(path=run_dir)
    assert Finding.objects.get(pk=finding.pk).closed_at is not None
