"""write_task: the three-phase contract, with real processes, real files and real kills."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from receipts import protocol, runtime
from receipts.demo import login_request, writer_command, writer_env
from tests.ledger import events_of
from tests.writer import cli_write_task

WRITE_TASK_FAILPOINTS = ["after_reserve", "after_task_file", "after_task_created", "after_commit"]


def task_files(run_dir: Path) -> list[str]:
    return sorted(path.name for path in (run_dir / "tasks").iterdir())


def record_of(run_dir: Path, submission_id: str) -> dict:
    return json.loads((run_dir / "submissions" / f"{protocol.submission_key(submission_id)}.json").read_bytes())


def test_first_call_creates_and_commits(run_dir):
    result = runtime.write_task(run_dir, login_request(), "sub-1")
    assert result == runtime.TaskResult("created", True, "TASK-000001", "tasks/TASK-000001.md")
    record = record_of(run_dir, "sub-1")
    assert record["state"] == "committed"
    assert record["request_digest"] == protocol.request_digest(login_request())
    assert record["digest_schema_version"] == "write-task-v1"
    task_bytes = (run_dir / "tasks" / "TASK-000001.md").read_bytes()
    assert record["task_sha256"] == protocol.sha256_hex(task_bytes)
    assert record["creation_result"]["task_sha256"] == record["task_sha256"]
    assert protocol.request_digest(record["request"]) == record["request_digest"]
    [event] = events_of(run_dir, "submission")
    assert event["disposition"] == "created" and event["action_taken"] is True
    assert event["client_submission_id"] == "sub-1" and event["task_id"] == "TASK-000001"


def test_same_id_same_request_is_reused_with_the_first_result(run_dir):
    first = runtime.write_task(run_dir, login_request(), "sub-1")
    again = runtime.write_task(run_dir, login_request(body="Steps:\r\n1. open /login\r\n2. submit"), "sub-1")
    assert again.disposition == "reused" and again.action_taken is False
    assert (again.task_id, again.task_path) == (first.task_id, first.task_path)
    assert task_files(run_dir) == ["TASK-000001.md"]
    assert [event["disposition"] for event in events_of(run_dir, "submission")] == ["created", "reused"]


def test_same_id_other_request_is_a_conflict_and_writes_nothing(run_dir):
    runtime.write_task(run_dir, login_request(), "sub-1")
    before = record_of(run_dir, "sub-1")
    result = runtime.write_task(run_dir, login_request(recipient="OPS"), "sub-1")
    assert result.disposition == "conflict" and result.action_taken is False
    assert result.reason == "request_digest_differs"
    assert task_files(run_dir) == ["TASK-000001.md"]
    assert record_of(run_dir, "sub-1") == before
    conflict = events_of(run_dir, "submission")[-1]
    assert conflict["disposition"] == "conflict" and conflict["reason"] == "request_digest_differs"


def test_cli_conflict_exits_3_and_adds_no_file(run_dir):
    assert cli_write_task(run_dir, login_request()).returncode == 0
    completed = cli_write_task(run_dir, login_request(recipient="OPS"))
    assert completed.returncode == 3
    output = json.loads(completed.stdout)
    assert set(output) == {"disposition", "action_taken", "task_id", "task_path", "legacy", "reason"}
    assert output["disposition"] == "conflict" and output["action_taken"] is False
    assert task_files(run_dir) == ["TASK-000001.md"]


def test_another_digest_schema_version_is_a_conflict(run_dir):
    runtime.write_task(run_dir, login_request(), "sub-1")
    path = run_dir / "submissions" / f"{protocol.submission_key('sub-1')}.json"
    record = json.loads(path.read_bytes())
    record["digest_schema_version"] = "write-task-v0"
    path.write_text(json.dumps(record))
    result = runtime.write_task(run_dir, login_request(), "sub-1")
    assert (result.disposition, result.reason) == ("conflict", "digest_schema_version_differs")
    assert events_of(run_dir, "submission")[-1]["reason"] == "digest_schema_version_differs"


def test_legacy_calls_create_a_new_task_every_time(run_dir):
    first = runtime.write_task(run_dir, login_request())
    second = runtime.write_task(run_dir, login_request())
    assert first.legacy and second.legacy and first.disposition == second.disposition == "created"
    assert first.task_id != second.task_id
    assert task_files(run_dir) == ["TASK-000001.md", "TASK-000002.md"]
    assert all("client_submission_id" not in event for event in events_of(run_dir, "submission"))
    assert list((run_dir / "submissions").iterdir()) == []


def test_submission_id_must_be_1_to_256_characters(run_dir):
    with pytest.raises(ValueError, match="1 to 256"):
        runtime.write_task(run_dir, login_request(), "")
    with pytest.raises(ValueError, match="1 to 256"):
        runtime.write_task(run_dir, login_request(), "x" * 257)
    assert runtime.write_task(run_dir, login_request(), "../../etc/passwd").disposition == "created"
    assert not (run_dir.parent.parent / "etc").exists()


def test_a_reserved_record_resumes_with_the_same_task_id(run_dir):
    assert cli_write_task(run_dir, login_request(), RECEIPTS_FAILPOINT="after_reserve").returncode == 137
    assert record_of(run_dir, "sub-1")["state"] == "reserved"
    assert task_files(run_dir) == []
    runtime.write_task(run_dir, login_request(subject="Other intent"), "sub-2")  # takes the next number
    result = runtime.write_task(run_dir, login_request(), "sub-1")
    assert (result.disposition, result.task_id) == ("created", "TASK-000001")


def test_a_reserved_record_adopts_its_own_task_file(run_dir):
    assert cli_write_task(run_dir, login_request(), RECEIPTS_FAILPOINT="after_task_file").returncode == 137
    assert record_of(run_dir, "sub-1")["state"] == "reserved"
    assert task_files(run_dir) == ["TASK-000001.md"]
    assert runtime.write_task(run_dir, login_request(), "sub-1").disposition == "created"
    assert record_of(run_dir, "sub-1")["state"] == "committed"


def test_a_reserved_record_with_another_file_in_its_place_is_a_conflict(run_dir):
    cli_write_task(run_dir, login_request(), RECEIPTS_FAILPOINT="after_reserve")
    (run_dir / "tasks" / "TASK-000001.md").write_text("somebody else's task\n")
    result = runtime.write_task(run_dir, login_request(), "sub-1")
    assert (result.disposition, result.reason) == ("conflict", "task_file_differs")
    assert (run_dir / "tasks" / "TASK-000001.md").read_text() == "somebody else's task\n"
    assert record_of(run_dir, "sub-1")["state"] == "reserved"


def test_task_created_with_the_file_gone_is_task_missing_never_a_new_task(run_dir):
    cli_write_task(run_dir, login_request(), RECEIPTS_FAILPOINT="after_task_created")
    (run_dir / "tasks" / "TASK-000001.md").unlink()
    result = runtime.write_task(run_dir, login_request(), "sub-1")
    assert (result.disposition, result.reason, result.task_id) == ("conflict", "task_missing", "TASK-000001")
    assert task_files(run_dir) == []


def test_task_created_with_a_changed_file_is_a_digest_conflict(run_dir):
    cli_write_task(run_dir, login_request(), RECEIPTS_FAILPOINT="after_task_created")
    (run_dir / "tasks" / "TASK-000001.md").write_text("edited\n")
    result = runtime.write_task(run_dir, login_request(), "sub-1")
    assert (result.disposition, result.reason) == ("conflict", "task_digest_mismatch")


def test_an_unreadable_record_is_a_conflict_and_is_left_alone(run_dir):
    path = run_dir / "submissions" / f"{protocol.submission_key('sub-1')}.json"
    path.write_bytes(b'{"state": NaN}')
    result = runtime.write_task(run_dir, login_request(), "sub-1")
    assert (result.disposition, result.reason) == ("conflict", "record_unreadable")
    assert path.read_bytes() == b'{"state": NaN}'


@pytest.mark.parametrize("failpoint", WRITE_TASK_FAILPOINTS)
def test_killed_at_each_failpoint_then_resumed_twice_gives_one_task(run_dir, failpoint):
    killed = cli_write_task(run_dir, login_request(), RECEIPTS_FAILPOINT=failpoint)
    assert killed.returncode == 137, killed.stderr
    first = cli_write_task(run_dir, login_request())
    second = cli_write_task(run_dir, login_request())
    assert first.returncode == second.returncode == 0
    first_output, second_output = json.loads(first.stdout), json.loads(second.stdout)
    assert first_output["task_id"] == second_output["task_id"] == "TASK-000001"
    assert second_output["disposition"] == "reused" and second_output["action_taken"] is False
    expected_first = "reused" if failpoint == "after_commit" else "created"
    assert first_output["disposition"] == expected_first
    assert task_files(run_dir) == ["TASK-000001.md"]
    assert record_of(run_dir, "sub-1")["state"] == "committed"
    history = [(e["disposition"], e.get("recovered", False)) for e in events_of(run_dir, "submission")]
    if failpoint == "after_commit":  # the killed process committed, but never recorded it
        assert history == [("created", True), ("reused", False), ("reused", False)]
    else:
        assert history == [("created", False), ("reused", False)]
    assert record_of(run_dir, "sub-1")["created_event_seq"] == events_of(run_dir, "submission")[0]["seq"]


def test_a2_lost_response_then_retry_reuses_the_task(run_dir):
    """Seeds' A2: the task is created, the caller never hears; its retry finds the first result."""
    lost = cli_write_task(run_dir, login_request(), "a2", RECEIPTS_FAILPOINT="after_commit")
    assert lost.returncode == 137 and lost.stdout == b""
    retry = json.loads(cli_write_task(run_dir, login_request(), "a2").stdout)
    assert retry == {
        "disposition": "reused",
        "action_taken": False,
        "task_id": "TASK-000001",
        "task_path": "tasks/TASK-000001.md",
        "legacy": False,
        "reason": None,
    }
    assert task_files(run_dir) == ["TASK-000001.md"]
    [created, reused] = events_of(run_dir, "submission")
    assert (created["disposition"], created["recovered"], created["task_id"]) == ("created", True, "TASK-000001")
    assert created["created_at"] == record_of(run_dir, "a2")["creation_result"]["created_at"]
    assert reused["disposition"] == "reused"


def test_a_record_from_before_the_event_marker_gets_no_second_created_event(run_dir):
    runtime.write_task(run_dir, login_request(), "sub-1")
    path = run_dir / "submissions" / f"{protocol.submission_key('sub-1')}.json"
    record = json.loads(path.read_bytes())
    del record["created_event_seq"]
    path.write_text(json.dumps(record))
    runtime.write_task(run_dir, login_request(), "sub-1")
    runtime.write_task(run_dir, login_request(), "sub-1")
    assert [e["disposition"] for e in events_of(run_dir, "submission")] == ["created", "reused", "reused"]
    assert record_of(run_dir, "sub-1")["created_event_seq"] == 2


@pytest.mark.parametrize(
    "change",
    [
        lambda record: record.update(request=["not", "an", "object"]),
        lambda record: record.update(creation_result=[1]),
        lambda record: record.update(task_id=7),
        lambda record: record.update(client_submission_id="another id"),
        lambda record: record.clear(),
    ],
    ids=["request", "creation_result", "task_id", "another id", "empty"],
)
def test_a_record_of_the_wrong_shape_is_an_invalid_record_conflict(run_dir, change):
    runtime.write_task(run_dir, login_request(), "sub-1")
    path = run_dir / "submissions" / f"{protocol.submission_key('sub-1')}.json"
    record = json.loads(path.read_bytes())
    change(record)
    path.write_text(json.dumps(record))
    before = path.read_bytes()
    completed = cli_write_task(run_dir, login_request())
    assert completed.returncode == 3 and b"Traceback" not in completed.stderr
    assert json.loads(completed.stdout)["reason"] == "record_invalid"
    assert path.read_bytes() == before


@pytest.mark.parametrize("counter", [b"[]", b"{}", b'{"next": "7"}', b'{"next": true}', b'{"next": 0}', b"nul"])
def test_a_task_counter_the_writer_cannot_read_is_one_line_of_error(run_dir, counter):
    (run_dir / ".writer").mkdir(exist_ok=True)
    (run_dir / ".writer" / "task-counter").write_bytes(counter)
    completed = cli_write_task(run_dir, login_request())
    assert completed.returncode == 1 and completed.stdout == b""
    assert completed.stderr.count(b"\n") == 1 and b"Traceback" not in completed.stderr
    assert task_files(run_dir) == []


@pytest.mark.slow
@pytest.mark.parametrize("processes", [8, 32, 64])
def test_a4_concurrent_writers_with_one_id_create_one_task(run_dir, processes):
    """Seeds' A4: N processes, one submission id, one request: created once, reused N-1 times."""
    request = json.dumps(login_request()).encode()
    command = writer_command("write-task", str(run_dir), "--request", "-", "--submission-id", "a4")
    children = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=writer_env())
        for _ in range(processes)
    ]
    outputs = []
    for child in children:
        stdout, _ = child.communicate(request, timeout=120)
        assert child.returncode == 0
        outputs.append(json.loads(stdout))
    dispositions = [output["disposition"] for output in outputs]
    assert dispositions.count("created") == 1
    assert dispositions.count("reused") == processes - 1
    assert {output["task_id"] for output in outputs} == {"TASK-000001"}
    assert task_files(run_dir) == ["TASK-000001.md"]
    assert len(events_of(run_dir, "submission")) == processes


@pytest.mark.slow
def test_concurrent_distinct_ids_get_distinct_task_numbers(run_dir):
    children = [
        subprocess.Popen(
            writer_command("write-task", str(run_dir), "--request", "-", "--submission-id", f"sub-{number}"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=writer_env(),
        )
        for number in range(16)
    ]
    task_ids = [
        json.loads(child.communicate(json.dumps(login_request()).encode(), timeout=120)[0])["task_id"]
        for child in children
    ]
    assert len(set(task_ids)) == 16
    assert len(task_files(run_dir)) == 16


def test_the_task_file_renders_the_normalised_request(run_dir):
    runtime.write_task(run_dir, login_request(body="a\r\nb"), "sub-1")
    text = (run_dir / "tasks" / "TASK-000001.md").read_text()
    assert text.startswith("# TASK-000001: Fix login\n")
    assert "\na\nb\n" in text and "\r" not in text
    assert '- client_submission_id: "sub-1"' in text
