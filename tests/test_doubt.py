"""What a person reads before settling: the call in plain words, and what the target shows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from django.urls import reverse

from evidence.ingest import importer
from receipts import doubt, runtime
from receipts.demo import run_writer
from tests.helpers import content, first_call_of
from tests.writer import FILE_ARGS, MESSAGE


def killed_call(run_dir: Path, tool: str, args: dict, failpoint: str) -> str:
    """Run the call in a child process killed at ``failpoint``; returns its call_id."""
    completed = run_writer(
        "call", str(run_dir), "--tool", tool, "--args", json.dumps(args), RECEIPTS_FAILPOINT=failpoint
    )
    assert completed.returncode == 137
    [receipt] = (run_dir / "receipts").glob("*.json")
    return receipt.stem


def test_a_sent_message_is_found_by_its_call_id(run_dir):
    call_id = killed_call(run_dir, "send_message", MESSAGE, "after_effect")
    evidence = doubt.send_message_evidence(run_dir, MESSAGE, call_id)
    assert evidence.verdict == doubt.PRESENT
    [fact] = evidence.facts
    assert fact.startswith("line 1: message msg-") and "to ops@example.com" in fact


def test_a_message_never_sent_has_no_line(run_dir):
    call_id = killed_call(run_dir, "send_message", MESSAGE, "after_prepared")
    evidence = doubt.send_message_evidence(run_dir, MESSAGE, call_id)
    assert evidence.verdict == doubt.ABSENT and "there is no outbox.jsonl" in evidence.facts[0]
    (run_dir / "outbox.jsonl").write_text(json.dumps({"call_id": "another", "to": "x", "body": "y"}) + "\n")
    evidence = doubt.send_message_evidence(run_dir, MESSAGE, call_id)
    assert evidence == doubt.Evidence(
        doubt.ABSENT, ("no line of outbox.jsonl carries this call_id (1 lines searched)",)
    )


def test_a_page_reads_the_end_of_a_big_outbox_and_never_calls_the_rest_absent(run_dir):
    """A page looks at the last PAGE_OUTBOX_BYTES of the outbox; the runtime reads it whole."""
    call_id = killed_call(run_dir, "send_message", MESSAGE, "after_effect")
    outbox = run_dir / "outbox.jsonl"
    ours = outbox.read_bytes()
    filler = b"".join(
        json.dumps({"call_id": f"{n:064x}", "to": "x", "body": "y" * 200}).encode() + b"\n"
        for n in range(doubt.PAGE_OUTBOX_BYTES // 250 + 1000)
    )
    assert len(filler) > doubt.PAGE_OUTBOX_BYTES
    adapter = runtime.BUILTIN_ADAPTERS["send_message"]
    assert isinstance(adapter, runtime.SendMessage)
    outbox.write_bytes(filler + ours)  # the call's line at the end, where a recent one is
    seen = doubt.evidence_for(run_dir, "send_message", MESSAGE, call_id)
    assert seen is not None and seen.verdict == doubt.PRESENT
    outbox.write_bytes(ours + filler)  # at the start: beyond what a page reads
    seen = doubt.evidence_for(run_dir, "send_message", MESSAGE, call_id)
    assert seen is not None and seen.verdict == doubt.UNCLEAR and f"search it for {call_id}" in seen.facts[0], seen
    assert adapter.evidence(run_dir, MESSAGE, call_id).verdict == doubt.PRESENT, "the runtime reads it whole"


def test_a_line_whose_call_id_is_written_with_escapes_is_still_found(run_dir):
    """Lines of other calls are passed over without parsing; an escaped id must not slip by."""
    call_id = "a" * 64
    escaped = "".join(f"\\u{ord(char):04x}" for char in call_id)
    (run_dir / "outbox.jsonl").write_text(
        json.dumps({"call_id": "b" * 64, "to": "x", "body": "y"}) + "\n"
        + '{"call_id": "' + escaped + '", "message_id": "msg-1", "to": "ops@example.com", "body": "deployed"}\n'
    )  # fmt: skip
    assert doubt.send_message_evidence(run_dir, MESSAGE, call_id).verdict == doubt.PRESENT


def test_an_old_line_without_a_call_id_makes_it_unclear(run_dir):
    (run_dir / "outbox.jsonl").write_text(json.dumps(MESSAGE) + "\n" + '{"torn": ' + "\n")
    evidence = doubt.send_message_evidence(run_dir, MESSAGE, "c" * 64)
    assert evidence.verdict == doubt.UNCLEAR
    assert "1 line(s) without a call_id hold the same recipient and body" in evidence.facts
    assert "1 line(s) are not whole JSON (a write that stopped short?)" in evidence.facts


def test_an_outbox_that_is_a_symlink_is_not_followed(run_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text(json.dumps({"call_id": "c" * 64}) + "\n")
    (run_dir / "outbox.jsonl").symlink_to(elsewhere)
    evidence = doubt.send_message_evidence(run_dir, MESSAGE, "c" * 64)
    assert evidence.verdict == doubt.UNCLEAR and "symlink" in evidence.facts[0]


@pytest.mark.parametrize(("failpoint", "verdict"), [("after_effect", doubt.PRESENT), ("after_prepared", doubt.ABSENT)])
def test_a_written_file_is_checked_by_its_digest(run_dir, failpoint, verdict):
    call_id = killed_call(run_dir, "write_file", FILE_ARGS, failpoint)
    assert doubt.write_file_evidence(run_dir, FILE_ARGS, call_id).verdict == verdict


def test_a_file_with_other_bytes_is_unclear_and_a_symlinked_folder_is_not_followed(run_dir, tmp_path):
    target = run_dir / "workspace" / "src"
    target.mkdir(parents=True)
    (target / "app.py").write_text("something else\n")
    evidence = doubt.write_file_evidence(run_dir, FILE_ARGS, "c" * 64)
    assert evidence.verdict == doubt.UNCLEAR and "holds other bytes" in evidence.facts[0]
    (target / "app.py").unlink()
    target.rmdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "app.py").write_text(FILE_ARGS["content"])
    target.symlink_to(outside)
    evidence = doubt.write_file_evidence(run_dir, FILE_ARGS, "c" * 64)
    assert evidence.verdict == doubt.UNCLEAR and "not followed" in evidence.facts[0]


def test_calls_are_described_in_plain_words():
    assert doubt.describe("send_message", MESSAGE) == "Send a message to ops@example.com: “deployed”"
    assert doubt.describe("write_file", FILE_ARGS) == "Write 12 bytes to workspace/src/app.py"
    assert doubt.describe("ticket", {"title": "x"}) == 'Run the tool ticket with {"title": "x"}'


class TicketTool:
    """Another runtime's tool: it files a ticket and loses the answer."""

    name: ClassVar[str] = "file_ticket"
    version: ClassVar[str] = "1.0.0"

    def normalise(self, args: Any) -> dict[str, Any]:
        return dict(args)

    def execute(self, run_dir: Path, args: Any, call_id: str) -> dict[str, Any]:
        (Path(run_dir) / "tickets.txt").write_text(f"{call_id} {args['title']}\n")
        raise runtime.OutcomeUnknown("the tracker timed out after the request was sent")


def ticket_evidence(run_dir: Path, args: Any, call_id: str) -> doubt.Evidence:
    lines = (run_dir / "tickets.txt").read_text().splitlines()
    found = [line for line in lines if line.startswith(call_id)]
    return doubt.Evidence(doubt.PRESENT if found else doubt.ABSENT, tuple(f"tracker: {line}" for line in found))


@pytest.mark.django_db
def test_another_runtime_registers_evidence_for_its_tool(run_dir, logged_in, monkeypatch):
    # Registered for this test only: the registry is the process's.
    monkeypatch.setattr(doubt, "_REGISTRY", dict(doubt._REGISTRY))
    outcome = runtime.Executor(run_dir, {"file_ticket": TicketTool()}).call("file_ticket", {"title": "Fix login"})
    assert outcome.status == "unknown"
    doubt.register_evidence("file_ticket", ticket_evidence)
    importer.run_import(path=run_dir)
    page = content(logged_in.get(reverse("call", args=[run_dir.name, outcome.call_id])))
    assert "This call is in doubt" in page
    assert f"tracker: {outcome.call_id} Fix login" in page and 'badge-info">present' in page
    assert first_call_of(run_dir.name).decision == "confirm"
