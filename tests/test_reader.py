"""The reader on hand-made hostile run directories: the right code, and the good records kept."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pytest

from receipts import durable, protocol, runtime
from receipts.findings import CODES
from receipts.reader import Limits, discover_runs, read_ledger, read_run
from tests.helpers import CONTRACT, PROJECT, corpus_files

GOOD_ARGS = {"path": "ok.txt", "content": "fine"}


@pytest.fixture
def good_run(run_dir: Path) -> Path:
    """A run with one good committed call and one committed task: what must survive beside the bad."""
    runtime.Executor(run_dir).call("write_file", GOOD_ARGS, attempt=1)
    runtime.write_task(run_dir, {"subject": "good"}, "good-sub")
    return run_dir


def codes(run: Path, **kwargs) -> dict[str, list[str]]:
    files, _ = read_run(run, **kwargs)
    found: dict[str, list[str]] = {}
    for finding in files.findings:
        found.setdefault(finding.code, []).append(finding.subject)
    return found


def assert_good_records_kept(run: Path) -> None:
    files, events = read_run(run)
    committed = [call for call in files.calls if call.status == "committed" and call.args == GOOD_ARGS]
    assert len(committed) == 1 and committed[0].verification == "verified"
    assert [s.client_submission_id for s in files.submissions if s.client_submission_id == "good-sub"]
    assert any(event.type == "submission" for event in events)


def good_call_id(run: Path) -> str:
    return protocol.make_call_id(CONTRACT, 1, "write_file", GOOD_ARGS, "1.0.0", "call-id-v2")


def write_receipt(run: Path, receipt: dict, name: str | None = None) -> Path:
    path = run / "receipts" / f"{name or receipt['call_id']}.json"
    path.write_text(json.dumps(receipt))
    return path


def v1_receipt(args: dict, **fields) -> dict:
    call_id = protocol.make_call_id(CONTRACT, 1, "tool_x", args)
    result = {"remote_resource_id": "r-1"}
    receipt = {"call_id": call_id, "status": "committed", "tool": "tool_x", "args": args, "attempt": 1}
    receipt |= {"result": result, "output_sha256": protocol.input_sha256(result)}
    receipt.update(fields)
    return receipt


def name_in_ledger(run: Path, call_id: str) -> None:
    durable.append_event(run, "receipt", {"call_id": call_id, "tool": "tool_x", "attempt": 1, "status": "committed"})


def test_a_clean_run_has_no_findings(good_run):
    assert codes(good_run) == {}
    assert_good_records_kept(good_run)


def test_invalid_json_receipt(good_run):
    (good_run / "receipts" / ("a" * 64 + ".json")).write_bytes(b'{"call_id": NaN}')
    assert codes(good_run)["invalid_json"] == [f"receipts/{'a' * 64}.json"]
    assert_good_records_kept(good_run)


def test_schema_error_receipt(good_run):
    write_receipt(good_run, {"call_id": "b" * 64, "status": "committed"})
    assert codes(good_run)["schema_error"] == [f"receipts/{'b' * 64}.json"]
    assert_good_records_kept(good_run)


def test_symlink_to_etc_passwd_as_a_receipt_is_unsafe_and_not_read(good_run):
    (good_run / "receipts" / ("c" * 64 + ".json")).symlink_to("/etc/passwd")
    found = codes(good_run)
    assert found["unsafe_path"] == [f"receipts/{'c' * 64}.json"]
    assert "invalid_json" not in found
    assert_good_records_kept(good_run)


def test_submissions_as_a_symlink_to_etc_is_unsafe_and_not_followed(good_run):
    real = good_run / "submissions"
    real.rename(good_run / "submissions.moved")
    (good_run / "submissions").symlink_to("/etc")
    files, _ = read_run(good_run)
    assert [f.subject for f in files.findings if f.code == "unsafe_path"] == ["submissions/"]
    assert files.submissions == []
    assert [call.status for call in files.calls] == ["committed"]


def test_a_fifo_in_receipts_is_unsafe_and_does_not_block(good_run):
    os.mkfifo(good_run / "receipts" / ("d" * 64 + ".json"))
    assert codes(good_run)["unsafe_path"] == [f"receipts/{'d' * 64}.json"]
    assert_good_records_kept(good_run)


def test_a_17_mib_receipt_is_oversize(good_run):
    big = v1_receipt({"blob": "x" * (17 * 1024 * 1024)})
    write_receipt(good_run, big)
    assert codes(good_run)["oversize"] == [f"receipts/{big['call_id']}.json"]
    assert_good_records_kept(good_run)


def test_a_2_mib_ledger_line_is_oversize_and_the_chain_goes_on(good_run):
    with (good_run / "events.jsonl").open("ab") as ledger:
        ledger.write(b'{"seq": 999, "type": "note", "blob": "' + b"x" * (2 * 1024 * 1024) + b'"}\n')
    durable.append_event(good_run, "note", {"after": True})
    files, events = read_run(good_run)
    oversize = [f for f in files.findings if f.code == "oversize"]
    assert len(oversize) == 1 and oversize[0].subject.startswith("events.jsonl line ")
    assert events[-1].payload and json.loads(events[-1].payload)["after"] is True
    assert "ledger_chain_broken" not in {f.code for f in files.findings}, "the chain counts the oversize line"
    assert_good_records_kept(good_run)


def test_receipt_name_mismatch(good_run):
    receipt = v1_receipt({"n": 1})
    write_receipt(good_run, receipt, name="e" * 64)
    assert codes(good_run)["receipt_name_mismatch"] == [f"receipts/{'e' * 64}.json"]


def test_identity_mismatch_with_stored_and_recomputed(good_run):
    path = good_run / "receipts" / f"{good_call_id(good_run)}.json"
    receipt = json.loads(path.read_bytes())
    receipt["attempt"] = 2
    path.write_text(json.dumps(receipt))
    files, _ = read_run(good_run)
    [finding] = [f for f in files.findings if f.code == "identity_mismatch"]
    assert finding.stored_value == good_call_id(good_run)
    assert finding.recomputed_value == protocol.make_call_id(
        CONTRACT, 2, "write_file", GOOD_ARGS, "1.0.0", "call-id-v2"
    )


def test_identity_unverifiable_without_an_attempt(good_run):
    receipt = v1_receipt({"n": 2})
    del receipt["attempt"]
    write_receipt(good_run, receipt)
    name_in_ledger(good_run, receipt["call_id"])
    assert codes(good_run) == {"identity_unverifiable": [f"receipts/{receipt['call_id']}.json"]}


def test_a_v1_receipt_takes_its_contract_from_steer_and_verifies(good_run):
    receipt = v1_receipt({"n": 3})
    write_receipt(good_run, receipt)
    name_in_ledger(good_run, receipt["call_id"])
    files, _ = read_run(good_run)
    assert codes(good_run) == {}
    assert {c.call_id: c.verification for c in files.calls}[receipt["call_id"]] == "verified"


def test_a_committed_receipt_must_carry_its_outcome_and_its_digest(good_run):
    bare = v1_receipt({"n": 5})
    del bare["result"], bare["output_sha256"]
    forged = v1_receipt({"n": 6}, result={"remote_resource_id": "r-forged"})
    for receipt in (bare, forged):
        write_receipt(good_run, receipt)
        name_in_ledger(good_run, receipt["call_id"])
    files, _ = read_run(good_run)
    verdicts = {call.call_id: call.verification for call in files.calls}
    assert (verdicts[bare["call_id"]], verdicts[forged["call_id"]]) == ("unverifiable", "mismatch")
    assert codes(good_run) == {
        "identity_unverifiable": [f"receipts/{bare['call_id']}.json"],
        "output_digest_mismatch": [f"receipts/{forged['call_id']}.json"],
    }


def test_a_committed_receipt_the_ledger_never_saw_committed_is_a_finding(good_run):
    receipt = v1_receipt({"n": 7})
    write_receipt(good_run, receipt)
    durable.append_event(good_run, "receipt", {"call_id": receipt["call_id"], "tool": "tool_x", "status": "prepared"})
    assert codes(good_run) == {"committed_event_missing": [f"receipts/{receipt['call_id']}.json"]}


def test_contract_mismatch(good_run):
    other = "f" * 64
    receipt = v1_receipt({"n": 4}, contract_sha256=other)
    receipt["call_id"] = protocol.make_call_id(other, 1, "tool_x", {"n": 4})
    write_receipt(good_run, receipt)
    name_in_ledger(good_run, receipt["call_id"])
    assert list(codes(good_run)) == ["contract_mismatch"]


def test_input_digest_mismatch(good_run):
    receipt = v1_receipt({"n": 5}, input_sha256="0" * 64)
    write_receipt(good_run, receipt)
    name_in_ledger(good_run, receipt["call_id"])
    assert list(codes(good_run)) == ["input_digest_mismatch"]


@pytest.mark.parametrize(("status", "code"), [("done", "invalid_status"), ("failed", "legacy_status")])
def test_invalid_and_legacy_statuses(good_run, status, code):
    receipt = v1_receipt({"n": 6}, status=status)
    write_receipt(good_run, receipt)
    # Named by an event with its own status: a committed one would be a commit edited since.
    event = {"call_id": receipt["call_id"], "tool": "tool_x", "attempt": 1, "status": status}
    durable.append_event(good_run, "receipt", event)
    assert list(codes(good_run)) == [code]
    files, _ = read_run(good_run)
    assert {c.call_id: c.status for c in files.calls}[receipt["call_id"]] == status


def test_missing_and_orphan_receipts(good_run):
    name_in_ledger(good_run, "9" * 64)
    receipt = v1_receipt({"n": 7})
    write_receipt(good_run, receipt)
    found = codes(good_run)
    assert found["missing_receipt"] == ["9" * 64]
    assert found["orphan_receipt"] == [f"receipts/{receipt['call_id']}.json"]
    files, _ = read_run(good_run)
    missing = [call for call in files.calls if not call.receipt_present]
    assert [call.call_id for call in missing] == ["9" * 64]


def ledger_lines(run: Path) -> list[bytes]:
    return (run / "events.jsonl").read_bytes().splitlines(keepends=True)


def test_ledger_seq_gap_duplicate_and_broken_chain(good_run):
    lines = ledger_lines(good_run)
    third = json.loads(lines[2])
    third["seq"] = 7  # a gap, which also breaks the chain for the line after
    lines[2] = protocol.canonical_json(third) + b"\n"
    lines.append(lines[1])  # seq 2 again, later
    (good_run / "events.jsonl").write_bytes(b"".join(lines))
    found = codes(good_run)
    assert found["ledger_seq_gap"] == ["events.jsonl line 3"]
    # line 4 (seq 4 after 7) goes back; the last line repeats seq 2
    assert found["ledger_seq_duplicate"] == ["events.jsonl line 4", f"events.jsonl line {len(lines)}"]
    assert "events.jsonl line 4" in found["ledger_chain_broken"]


def test_a_payload_edited_with_its_seq_intact_breaks_the_chain_at_the_next_line(good_run):
    """The chain alone catches it: seq stays in order, the line still parses, only its bytes
    changed, so the next line's prev_sha256 no longer names them."""
    lines = ledger_lines(good_run)
    second = json.loads(lines[1])
    second["edited"] = "after the fact"
    lines[1] = protocol.canonical_json(second) + b"\n"
    (good_run / "events.jsonl").write_bytes(b"".join(lines))
    found = codes(good_run)
    assert found["ledger_chain_broken"] == ["events.jsonl line 3"]
    assert "ledger_seq_gap" not in found and "ledger_seq_duplicate" not in found


def test_submission_digest_mismatch_and_conflict(good_run):
    runtime.write_task(good_run, {"subject": "good", "recipient": "OPS"}, "good-sub")
    key = protocol.submission_key("good-sub")
    path = good_run / "submissions" / f"{key}.json"
    record = json.loads(path.read_bytes())
    record["request"]["subject"] = "edited"
    path.write_text(json.dumps(record))
    found = codes(good_run)
    assert found["submission_digest_mismatch"] == [f"submissions/{key}.json"]
    assert found["submission_conflict"] == ["submission good-sub"]


def test_a_submission_conflict_is_one_finding_with_both_digests(good_run):
    """The refused second request is one event that says both (a conflict disposition, a second
    digest): one finding, the first digest beside the second; a later conflict is the same row."""
    runtime.write_task(good_run, {"subject": "good", "recipient": "OPS"}, "good-sub")
    runtime.write_task(good_run, {"subject": "third", "recipient": "OPS"}, "good-sub")
    files, _ = read_run(good_run)
    conflicts = [f for f in files.findings if f.code == "submission_conflict"]
    assert [f.subject for f in conflicts] == ["submission good-sub", "submission good-sub"]
    first, later = conflicts
    submissions = [json.loads(line) for line in ledger_lines(good_run) if b'"submission"' in line]
    digests = [event["request_digest"] for event in submissions if event["client_submission_id"] == "good-sub"]
    assert (first.stored_value, first.recomputed_value) == (digests[0], digests[1])
    assert (later.stored_value, later.recomputed_value) == (digests[0], digests[2])
    assert "disposition conflict (request_digest_differs)" in first.detail and "two request digests" in first.detail
    assert first.detail.split(":")[0] != later.detail.split(":")[0]  # each names its own seq


def test_task_missing_and_task_digest_mismatch(good_run):
    runtime.write_task(good_run, {"subject": "second"}, "second-sub")
    (good_run / "tasks" / "TASK-000001.md").unlink()
    (good_run / "tasks" / "TASK-000002.md").write_text("edited\n")
    found = codes(good_run)
    assert found["task_missing"] == [f"submissions/{protocol.submission_key('good-sub')}.json"]
    assert found["task_digest_mismatch"] == [f"submissions/{protocol.submission_key('second-sub')}.json"]


def test_stale_reservation_and_stale_call_appear_only_past_the_stale_age(good_run, monkeypatch):
    monkeypatch.setenv("RECEIPTS_FAILPOINT", "")
    record_path = good_run / "submissions" / f"{protocol.submission_key('good-sub')}.json"
    record = json.loads(record_path.read_bytes())
    record["state"] = "task_created"
    record_path.write_text(json.dumps(record))
    receipt_path = good_run / "receipts" / f"{good_call_id(good_run)}.json"
    receipt = json.loads(receipt_path.read_bytes())
    receipt["status"] = "unknown"
    receipt_path.write_text(json.dumps(receipt))
    soon = protocol.utc_now() + dt.timedelta(minutes=5)
    files, _ = read_run(good_run, now=soon)
    assert not {f.code for f in files.findings} & {"stale_reservation", "stale_call"}
    assert files.next_stale_at is not None and files.next_stale_at > soon
    later = protocol.utc_now() + dt.timedelta(minutes=16)
    found = codes(good_run, now=later)
    assert found["stale_reservation"] == [record_path.relative_to(good_run).as_posix()]
    assert found["stale_call"] == [receipt_path.relative_to(good_run).as_posix()]
    [detail] = [f.detail for f in read_run(good_run, now=later)[0].findings if f.code == "stale_reservation"]
    assert "file present: yes; digests match: yes" in detail
    shorter = Limits(stale_after=dt.timedelta(minutes=1))
    assert "stale_call" in codes(good_run, now=soon, limits=shorter)


def test_confirmation_invalid_when_the_receipt_changed(good_run):
    call_id = good_call_id(good_run)
    document = {
        "schema": "confirmation/v1",
        "call_id": call_id,
        "resolution": "committed",
        "reason": "seen in the log",
        "actor": "alice",
        "confirmed_at": "2026-11-29T12:00:00Z",
        "receipt_sha256": "0" * 64,
        "confirmation_id": protocol.confirmation_id(call_id, "committed", "0" * 64),
    }
    (good_run / "confirmations" / f"{call_id}.json").write_text(json.dumps(document))
    files, _ = read_run(good_run)
    [finding] = [f for f in files.findings if f.code == "confirmation_invalid"]
    assert "changed" in finding.detail and finding.call_id == call_id
    assert [c.valid for c in files.confirmations] == [False]


def test_every_corpus_file_as_a_receipt_and_as_a_ledger_line(good_run):
    files = corpus_files()
    for index, path in enumerate(files):
        (good_run / "receipts" / f"{index:064x}.json").write_bytes(path.read_bytes())
    with (good_run / "events.jsonl").open("ab") as ledger:
        for path in files:
            ledger.write(path.read_bytes().replace(b"\n", b" ").replace(b"\r", b" ") + b"\n")
    durable.append_event(good_run, "note", {"after": "the corpus"})
    read, events = read_run(good_run)  # never raises
    receipt_findings = {f.subject for f in read.findings if f.subject.startswith("receipts/")}
    for index, path in enumerate(files):
        if path.name.startswith("n_"):
            assert f"receipts/{index:064x}.json" in receipt_findings, path.name
    ledger_codes = {f.code for f in read.findings if f.subject.startswith("events.jsonl")}
    assert {"invalid_json", "schema_error"} <= ledger_codes
    assert json.loads(events[-1].payload)["after"] == "the corpus"
    assert_good_records_kept(good_run)


@pytest.mark.parametrize(
    "line",
    [
        b'{"seq": 99, "type": "x", "n": NaN}',
        b'\xef\xbb\xbf{"seq": 99, "type": "x"}',
        b'{"seq": 99, "seq": 98}',
        b"\xff\xfe",
    ],
    ids=["nan", "bom", "duplicate-keys", "invalid-utf8"],
)
def test_bad_ledger_lines_are_invalid_json_and_the_rest_is_read(good_run, line):
    before = len(read_run(good_run)[1])
    with (good_run / "events.jsonl").open("ab") as ledger:
        ledger.write(line + b"\n")
    durable.append_event(good_run, "note", {})
    read, events = read_run(good_run)
    assert [f.code for f in read.findings if f.subject.startswith("events.jsonl")] == ["invalid_json"]
    assert len(events) == before + 1


def test_a_last_line_without_newline_is_a_write_in_progress(good_run):
    with (good_run / "events.jsonl").open("ab") as ledger:
        ledger.write(b'{"seq": 99, "type": "note"')
    batches = list(read_ledger(good_run))
    cursor = batches[-1].cursor
    assert cursor.offset == len(b"".join(ledger_lines(good_run)[:-1]))
    assert all(not batch.findings for batch in batches)


def test_bad_run_directory_names_are_unsafe(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    (root / "bad$name").mkdir()
    (root / "good-run").mkdir()
    (root / "link-run").symlink_to(root / "good-run")
    discovery = discover_runs(root)
    assert [path.name for path in discovery.runs] == ["good-run"]
    assert sorted((f.code, f.subject) for f in discovery.findings) == [
        ("unsafe_path", "bad$name"),
        ("unsafe_path", "link-run"),
    ]
    dotted = discover_runs(Path(f"{root}/../x"))
    assert dotted.runs == [] and dotted.findings[0].code == "unsafe_path"


def test_every_code_of_the_spec_is_known():
    spec = (PROJECT / "docs" / "RUN_DIRECTORY.md").read_text()
    table = spec[spec.index("## Finding codes") :]
    named = {
        part.strip("` ")
        for line in table.splitlines()
        if line.startswith("| `")
        for part in line.split("|")[1].split("/")
    }
    assert named == set(CODES)


def test_a_run_without_state_or_steer_says_so_plainly(good_run):
    (good_run / "state.json").unlink()
    (good_run / "steer.json").unlink()
    files, _ = read_run(good_run)
    assert [(f.code, f.subject) for f in files.findings if f.subject in ("state.json", "steer.json")] == [
        ("schema_error", "steer.json")
    ]
    assert "unsafe_path" not in {f.code for f in files.findings}
    assert files.state == "" and files.contract_sha256 == ""


def test_a_receipt_that_vanishes_while_listed_is_not_a_finding(good_run, monkeypatch):
    from receipts.reader import checks as reading

    ghost = "f" * 64 + ".json"
    real = reading.list_names
    monkeypatch.setattr(reading, "list_names", lambda fd: [*real(fd), ghost])
    files, _ = read_run(good_run)
    assert not [f for f in files.findings if ghost in f.subject]
    assert_good_records_kept(good_run)


@pytest.mark.parametrize("kind", ["folder", "fifo", "symlink"])
def test_a_steer_json_that_is_not_a_regular_file_has_no_birth_digest_and_raises_nothing(good_run, kind):
    """Which run a directory holds (``birth_digest``): nothing, never an exception, for a
    steer.json that is a folder (``os.fdopen`` refuses one), a FIFO or a symlink."""
    from receipts.reader import birth_digest

    assert len(birth_digest(good_run)) == 64
    steer = good_run / "steer.json"
    steer.unlink()
    if kind == "folder":
        steer.mkdir()
    elif kind == "fifo":
        os.mkfifo(steer)
    else:
        steer.symlink_to("/etc/passwd")
    assert birth_digest(good_run) == ""
