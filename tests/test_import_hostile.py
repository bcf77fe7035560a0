"""Hostile run directories: each problem is a finding on its run, the good records
beside it are imported, and the runs after it are imported too. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from evidence.ingest import importer
from evidence.models import Call, Event, Finding, Run, Submission
from receipts import durable, protocol, runtime
from tests.helpers import CONTRACT

pytestmark = pytest.mark.django_db

FILE_ARGS = {"path": "a.txt", "content": "hello"}


def good_run(root: Path, run_id: str) -> Path:
    """A run the writer made: one committed call and one created task."""
    run_dir = root / run_id
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    runtime.Executor(run_dir).call("write_file", FILE_ARGS, attempt=1)
    runtime.write_task(run_dir, {"subject": "Fix login"}, "sub-1")
    return run_dir


def import_root(root: Path, *args: str) -> dict:
    out = StringIO()
    call_command("import_runs", str(root), "--json", *args, stdout=out)
    return json.loads(out.getvalue())


def open_findings(run_id: str) -> set[tuple[str, str]]:
    rows = Finding.objects.filter(run__run_id=run_id, closed_at__isnull=True).values_list("code", "subject")
    return set(rows)


def assert_good_records_kept(run_id: str) -> None:
    assert Call.objects.filter(run__run_id=run_id, status="committed", verification="verified").count() == 1
    assert Submission.objects.filter(run__run_id=run_id, client_submission_id="sub-1", state="committed").exists()
    assert Event.objects.filter(run__run_id=run_id, type="receipt").count() == 2


def receipt_path(run_dir: Path) -> Path:
    [path] = (run_dir / "receipts").glob("*.json")
    return path


def edit_json(path: Path, **changes) -> None:
    document = json.loads(path.read_bytes())
    document.update(changes)
    path.write_text(json.dumps(document, ensure_ascii=False))


def append_line(run_dir: Path, line: bytes) -> None:
    with (run_dir / "events.jsonl").open("ab") as ledger:
        ledger.write(line)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A runs root with a hostile run ``bad`` (made good, for the test to spoil) and a
    good run ``zz-after`` that sorts after it."""
    root = tmp_path / "runs"
    good_run(root, "bad")
    good_run(root, "zz-after")
    return root


def import_and_check(root: Path) -> dict:
    report = import_root(root)
    assert [run["run_id"] for run in report["runs"]] == ["bad", "zz-after"]
    assert_good_records_kept("zz-after")
    assert open_findings("zz-after") == set()
    return report


@pytest.mark.parametrize(
    "moment",
    ["0001-01-01T00:30:00+01:00", "9999-12-31T23:59:59-01:00", "9999-12-31T23:59:59.999999Z", "0001-01-01T00:00:00Z"],
)
def test_times_at_the_ends_of_the_calendar(root, moment):
    bad = root / "bad"
    edit_json(receipt_path(bad), updated_at=moment, created_at=moment)
    record = next((bad / "submissions").iterdir())
    edit_json(record, reserved_at=moment, updated_at=moment, state="reserved")
    durable.append_event(bad, "note", {})
    ledger = (bad / "events.jsonl").read_bytes().splitlines()
    last = json.loads(ledger[-1])
    last["ts"] = moment
    append_line(
        bad,
        protocol.canonical_json({**last, "seq": last["seq"] + 1, "prev_sha256": protocol.sha256_hex(ledger[-1])})
        + b"\n",
    )
    import_and_check(root)
    codes = {code for code, _ in open_findings("bad")}
    try:
        protocol.parse_time(moment)
    except ValueError:
        assert "schema_error" in codes  # no UTC form: not a time
    else:
        assert Event.objects.filter(run__run_id="bad", ts=protocol.parse_time(moment)).exists()
    assert "import_failed" not in codes
    assert Call.objects.filter(run__run_id="bad").count() == 1
    response_codes = {code for code, _ in open_findings("bad")}
    assert "identity_mismatch" not in response_codes


@pytest.mark.parametrize("number", [2**63, 2**70, -(2**63) - 1])
def test_integers_past_64_bits(root, number):
    bad = root / "bad"
    edit_json(bad / "state.json", attempts=number)
    edit_json(receipt_path(bad), attempt=number)
    append_line(bad, protocol.canonical_json({"seq": number, "ts": "2026-11-30T00:00:00Z", "type": "note"}) + b"\n")
    import_and_check(root)
    findings = open_findings("bad")
    assert ("schema_error", "state.json") in findings
    assert ("schema_error", f"receipts/{receipt_path(bad).name}") in findings
    assert any(code == "schema_error" and subject.startswith("events.jsonl line") for code, subject in findings)
    assert Run.objects.get(run_id="bad").attempts is None
    assert Call.objects.get(run__run_id="bad").attempt is None


def test_attempts_past_32_bits_are_kept(root):
    edit_json(root / "bad" / "state.json", attempts=2**40)
    import_and_check(root)
    assert Run.objects.get(run_id="bad").attempts == 2**40


def test_names_that_are_not_utf8(root):
    root_bytes = os.fsencode(root)
    os.mkdir(root_bytes + b"/run-\xff")
    bad_bytes = os.fsencode(root / "bad")
    good_receipt = receipt_path(root / "bad").read_bytes()
    with open(bad_bytes + b"/receipts/\xfe\xff.json", "wb") as receipt:
        receipt.write(good_receipt)
    with open(bad_bytes + b"/confirmations/\xfe.json", "wb") as confirmation:
        confirmation.write(b"{}")
    report = import_and_check(root)
    assert {f["code"] for f in report["root_findings"]} == {"unsafe_path"}
    assert [f["subject"] for f in report["root_findings"]] == ["run-\\xff"]
    findings = open_findings("bad")
    assert ("unsafe_path", "receipts/\\xfe\\xff.json") in findings
    assert ("unsafe_path", "confirmations/\\xfe.json") in findings
    assert_good_records_kept("bad")


def test_an_oversize_last_line_still_being_written(root):
    bad = root / "bad"
    append_line(bad, b'{"seq": 99, "type": "note", "pad": "' + b"x" * 5000)
    import_root(root, "--max-line-mib", "0.001")
    assert_good_records_kept("bad")
    assert open_findings("bad") == set(), "a line in progress is not read, and no finding yet"
    append_line(bad, b'"}\n')
    durable.append_event(bad, "note", {})
    import_root(root, "--max-line-mib", "0.001")
    findings = open_findings("bad")
    assert any(code == "oversize" for code, _ in findings)
    assert Event.objects.filter(run__run_id="bad", type="note").exists(), "the line after it is read"


def test_u0000_in_strings_the_writer_writes(root):
    bad = root / "bad"
    runtime.write_task(bad, {"subject": "nul\x00here"}, "sub\x00nul")
    runtime.Executor(bad).call("send_message", {"to": "ops@example.com", "body": "a\x00b"}, attempt=1)
    edit_json(bad / "state.json", name="run\x00ning")
    durable.append_event(bad, "no\x00te", {"client_submission_id": "x\x00y"})
    import_and_check(root)
    submission = Submission.objects.get(run__run_id="bad", client_submission_id="sub\ufffdnul")
    assert submission.request is not None and submission.request["subject"] == "nul\x00here", "JSON keeps U+0000"
    message = Call.objects.get(run__run_id="bad", tool="send_message")
    assert message.args is not None and message.args["body"] == "a\x00b" and message.verification == "verified"
    assert Run.objects.get(run_id="bad").state == "run\ufffdning"
    assert Event.objects.filter(run__run_id="bad", type="no\ufffdte").exists()
    history = Event.objects.filter(run__run_id="bad", client_submission_id="sub\ufffdnul").values_list(
        "disposition", flat=True
    )
    assert list(history) == ["created"]
    codes = {code for code, _ in open_findings("bad")}
    assert "unstorable_value" in codes and "import_failed" not in codes


def test_values_longer_than_their_columns(root):
    bad = root / "bad"
    edit_json(receipt_path(bad), identity="i" * 5000)
    long_name = "a" * 240 + ".json"
    (bad / "receipts" / long_name).write_bytes(b"[]")
    (bad / "confirmations" / long_name).write_bytes(b"{}")
    durable.append_event(bad, "receipt", {"call_id": "c" * 300, "status": ["x"]})
    durable.append_event(bad, "receipt", {"call_id": "../x/y", "status": "committed"})
    import_and_check(root)
    findings = open_findings("bad")
    assert ("unsafe_path", f"receipts/{long_name}") in findings
    assert ("unsafe_path", f"confirmations/{long_name}") in findings
    assert any(code == "identity_unverifiable" for code, _ in findings)
    assert Call.objects.filter(run__run_id="bad").count() == 1, "no call row for an id that cannot name a file"


@pytest.fixture
def failing_insert():
    """A real database failure nobody foresaw: a trigger that refuses one tool's receipt row."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION refuse_explode() RETURNS trigger AS $$ BEGIN "
                "IF NEW.tool = 'explode' THEN RAISE EXCEPTION 'the disk said no'; END IF; RETURN NEW; END $$ "
                "LANGUAGE plpgsql"
            )
            cursor.execute(
                "CREATE TRIGGER refuse_explode BEFORE INSERT OR UPDATE ON receipts_call "
                "FOR EACH ROW EXECUTE FUNCTION refuse_explode()"
            )
        else:
            for event in ("INSERT", "UPDATE"):
                cursor.execute(
                    f"CREATE TRIGGER refuse_explode_{event.lower()} BEFORE {event} ON receipts_call "
                    "WHEN NEW.tool = 'explode' BEGIN SELECT RAISE(ABORT, 'the disk said no'); END"
                )
    yield
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("DROP TRIGGER refuse_explode ON receipts_call")
            cursor.execute("DROP FUNCTION refuse_explode()")
        else:
            cursor.execute("DROP TRIGGER refuse_explode_insert")
            cursor.execute("DROP TRIGGER refuse_explode_update")


def test_a_failure_nobody_foresaw_is_rolled_back_reported_and_the_next_run_imported(root, failing_insert):
    bad = root / "bad"
    edit_json(receipt_path(bad), tool="explode")
    report = import_and_check(root)
    [bad_report] = [run for run in report["runs"] if run["run_id"] == "bad"]
    [failure] = [f for f in bad_report["findings"] if f["code"] == "import_failed"]
    assert "the disk said no" in failure["detail"]
    assert not Call.objects.filter(run__run_id="bad").exists(), "the files' transaction was rolled back"
    assert Run.objects.get(run_id="bad").fingerprint == "", "the run is read again next time"
    assert Event.objects.filter(run__run_id="bad").count() > 0, "committed ledger batches stay"
    edit_json(receipt_path(bad), tool="write_file")
    import_root(root)
    assert "import_failed" not in {code for code, _ in open_findings("bad")}
    assert_good_records_kept("bad")


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_a_ledger_that_is_not_a_regular_file_keeps_its_finding_open(root, kind):
    ledger = root / "bad" / "events.jsonl"
    ledger.unlink()
    if kind == "fifo":
        os.mkfifo(ledger)
    elif kind == "symlink":
        ledger.symlink_to(root / "zz-after" / "events.jsonl")
    else:
        ledger.mkdir()
    for _ in range(2):
        import_and_check(root)
        assert ("unsafe_path", "events.jsonl") in open_findings("bad")


def test_a_duplicate_seq_with_other_content_is_kept_in_its_finding(root):
    bad = root / "bad"
    lines = (bad / "events.jsonl").read_bytes().splitlines()
    forged = json.loads(lines[1])
    forged.update(status="committed", note="written twice", prev_sha256=protocol.sha256_hex(lines[-1]))
    forged_line = protocol.canonical_json(forged)
    append_line(bad, forged_line + b"\n")
    import_and_check(root)
    [finding] = Finding.objects.filter(run__run_id="bad", code="ledger_seq_duplicate")
    assert finding.evidence == forged_line.decode()
    assert finding.recomputed_value == protocol.sha256_hex(forged_line)
    stored = Event.objects.get(run__run_id="bad", seq=forged["seq"])
    assert stored.payload == json.loads(lines[1]), "the first line with the seq is the event"


def test_a_ledger_that_stops_carrying_its_chain_is_broken(root):
    bad = root / "bad"
    lines = (bad / "events.jsonl").read_bytes().splitlines()
    edited = json.loads(lines[-1])
    del edited["prev_sha256"]
    (bad / "events.jsonl").write_bytes(b"\n".join([*lines[:-1], protocol.canonical_json(edited)]) + b"\n")
    import_and_check(root)
    assert ("ledger_chain_broken", f"events.jsonl line {len(lines)}") in open_findings("bad")


def test_the_same_run_id_under_two_roots_is_refused_the_second_time(root, tmp_path):
    other_root = tmp_path / "other-runs"
    other = good_run(other_root, "bad")
    durable.append_event(other, "note", {"from": "the other root"})
    import_and_check(root)
    before = list(Event.objects.filter(run__run_id="bad").values_list("seq", "line_sha256"))
    report = import_root(other_root)
    assert report["runs"] == []
    assert [(f["code"], f["subject"]) for f in report["root_findings"]] == [("duplicate_run_id", "bad")]
    assert list(Event.objects.filter(run__run_id="bad").values_list("seq", "line_sha256")) == before
    assert "ledger_rewritten" not in {code for code, _ in open_findings("bad")}
    assert Run.objects.get(run_id="bad").path == str((root / "bad").absolute())


def test_a_run_that_moved_is_followed(root, tmp_path):
    import_and_check(root)
    moved_root = tmp_path / "moved"
    moved_root.mkdir()
    (root / "bad").rename(moved_root / "bad")
    report = import_root(moved_root)
    assert [run["run_id"] for run in report["runs"]] == ["bad"]
    assert Run.objects.get(run_id="bad").path == str((moved_root / "bad").absolute())
    assert_good_records_kept("bad")


def test_entries_of_a_runs_root_that_are_not_runs_are_reported(root):
    (root / "README.txt").write_text("not a run")
    (root / ".git").mkdir()
    (root / ".DS_Store").write_bytes(b"\0")
    report = import_and_check(root)
    assert sorted((f["code"], f["subject"]) for f in report["root_findings"]) == [
        ("not_a_run", ".DS_Store"),
        ("not_a_run", ".git"),
        ("not_a_run", "README.txt"),
    ]


def test_the_watch_goes_on_after_a_bad_run(root):
    edit_json(root / "bad" / "state.json", attempts=2**70)
    (root / "bad" / "receipts" / ("b" * 250 + ".json")).write_bytes(b"[]")
    report = importer.root_import(root=root)
    assert [run.run_id for run in report.runs] == ["bad", "zz-after"]
    assert not any(run.failed for run in report.runs)
