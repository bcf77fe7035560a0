"""The executor: receipts around tool calls, reuse, recovery, and real kills at failpoints."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path
from typing import Any, ClassVar

import pytest

from receipts import protocol, runtime
from receipts.demo import run_writer
from tests.helpers import CONTRACT
from tests.ledger import events_of, read_ledger
from tests.writer import FILE_ARGS, MESSAGE, cli_call, outbox_lines, receipt_of, with_file_size_limit

CALL_FAILPOINTS = ["after_prepared", "after_effect", "after_temp_receipt"]


class CountingAdapter:
    """A test tool that counts executions and can be told to fail."""

    name: ClassVar[str] = "counting"
    version: ClassVar[str] = "2.0.0"

    def __init__(self, raise_: Exception | None = None, mutate: bool = False) -> None:
        self.executions = 0
        self.raise_ = raise_
        self.mutate = mutate

    def normalise(self, args: Any) -> dict[str, Any]:
        return dict(args)

    def execute(self, run_dir: Path, args: Any, call_id: str) -> dict[str, Any]:  # Any: it may mutate them
        self.executions += 1
        if self.mutate:
            args["injected"] = True
            args.clear()
        if self.raise_ is not None:
            raise self.raise_
        return {"remote_resource_id": f"r-{self.executions}"}


def test_a_call_is_prepared_then_committed_with_a_checked_result(run_dir):
    outcome = runtime.Executor(run_dir).call("write_file", FILE_ARGS, attempt=1)
    assert outcome.status == "committed" and outcome.reused is False
    receipt = receipt_of(run_dir, outcome.call_id)
    assert receipt["identity"] == "call-id-v2" and receipt["tool_version"] == runtime.WriteFile.version
    assert receipt["call_id"] == protocol.make_call_id(CONTRACT, 1, "write_file", FILE_ARGS, "1.0.0", "call-id-v2")
    assert receipt["input_sha256"] == protocol.input_sha256(FILE_ARGS)
    assert receipt["output_sha256"] == protocol.input_sha256(receipt["result"])
    assert receipt["result"]["file_sha256"] == protocol.sha256_hex((run_dir / "workspace/src/app.py").read_bytes())
    assert receipt["queryable"] is True
    assert [event["status"] for event in events_of(run_dir, "receipt")] == ["prepared", "committed"]


def test_a_committed_call_is_reused_never_executed_again(run_dir):
    adapter = CountingAdapter()
    executor = runtime.Executor(run_dir, {"counting": adapter})
    first = executor.call("counting", {"x": 1}, attempt=1)
    again = executor.call("counting", {"x": 1}, attempt=1)
    assert adapter.executions == 1
    assert again.reused is True and again.result == first.result and again.call_id == first.call_id
    assert [event["call_id"] for event in events_of(run_dir, "call_reused")] == [first.call_id]


def test_the_call_id_is_fixed_before_an_adapter_mutates_its_input(run_dir):
    adapter = CountingAdapter(mutate=True)
    outcome = runtime.Executor(run_dir, {"counting": adapter}).call("counting", {"x": 1}, attempt=1)
    expected = protocol.make_call_id(CONTRACT, 1, "counting", {"x": 1}, "2.0.0", "call-id-v2")
    assert outcome.call_id == expected
    assert receipt_of(run_dir, expected)["args"] == {"x": 1}


def test_a_new_tool_version_is_a_new_identity(run_dir):
    class Newer(CountingAdapter):
        version = "3.0.0"

    old = runtime.Executor(run_dir, {"counting": CountingAdapter()}).call("counting", {"x": 1}, attempt=1)
    new = runtime.Executor(run_dir, {"counting": Newer()}).call("counting", {"x": 1}, attempt=1)
    assert new.call_id != old.call_id and new.reused is False


@pytest.mark.parametrize("kind", ["retryable", "permanent"])
def test_a_refusal_is_rejected_with_its_kind(run_dir, kind):
    adapter = CountingAdapter(raise_=runtime.Rejected("target said no", kind=kind))
    outcome = runtime.Executor(run_dir, {"counting": adapter}).call("counting", {"x": 1}, attempt=1)
    assert outcome.status == "rejected" and outcome.error == {"kind": kind, "message": "target said no"}
    assert receipt_of(run_dir, outcome.call_id)["error"]["kind"] == kind
    runtime.Executor(run_dir, {"counting": adapter}).call("counting", {"x": 1}, attempt=1)
    assert adapter.executions == 1, "a rejected attempt is retried under the next attempt, not re-run"


@pytest.mark.parametrize("error", [runtime.OutcomeUnknown("timeout after sending"), ConnectionResetError("reset")])
def test_an_unknowable_outcome_is_unknown_and_waits_for_a_person(run_dir, error):
    adapter = CountingAdapter(raise_=error)
    executor = runtime.Executor(run_dir, {"counting": adapter})
    outcome = executor.call("counting", {"x": 1}, attempt=1)
    assert (outcome.status, outcome.needs) == ("unknown", "confirmation")
    again = executor.call("counting", {"x": 1}, attempt=1)
    assert (again.status, adapter.executions) == ("unknown", 1)


def test_invalid_args_are_rejected_permanently_and_on_record(run_dir):
    outcome = runtime.Executor(run_dir).call("write_file", {"path": "../../escape", "content": "x"}, attempt=1)
    assert outcome.status == "rejected" and outcome.error is not None and outcome.error["kind"] == "permanent"
    assert "leaves the workspace" in outcome.error["message"]
    assert not (run_dir.parent / "escape").exists()
    assert receipt_of(run_dir, outcome.call_id)["status"] == "rejected"


def confirm(run_dir: Path, call_id: str, resolution: str) -> None:
    receipt_bytes = (run_dir / "receipts" / f"{call_id}.json").read_bytes()
    digest = protocol.sha256_hex(receipt_bytes)
    document = {
        "schema": "confirmation/v1",
        "call_id": call_id,
        "resolution": resolution,
        "reason": "checked the mail server log",
        "actor": "alice",
        "confirmed_at": protocol.format_time(protocol.utc_now()),
        "receipt_sha256": digest,
        "confirmation_id": protocol.confirmation_id(call_id, resolution, digest),
    }
    (run_dir / "confirmations" / f"{call_id}.json").write_text(json.dumps(document))


def test_a_confirmed_committed_call_is_reused_and_its_receipt_untouched(run_dir):
    assert cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    [receipt_path] = (run_dir / "receipts").iterdir()
    call_id = receipt_path.stem
    confirm(run_dir, call_id, "committed")
    before = receipt_path.read_bytes()
    completed = cli_call(run_dir, "send_message", MESSAGE)
    assert completed.returncode == 0
    assert json.loads(completed.stdout)["reused"] is True
    assert receipt_path.read_bytes() == before
    assert len(outbox_lines(run_dir)) == 1


def test_a_confirmed_rejected_call_is_retried_under_the_next_attempt(run_dir):
    cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_prepared")
    [receipt_path] = (run_dir / "receipts").iterdir()
    confirm(run_dir, receipt_path.stem, "rejected")
    resumed = cli_call(run_dir, "send_message", MESSAGE)
    assert resumed.returncode == 3 and json.loads(resumed.stdout)["status"] == "rejected"
    assert outbox_lines(run_dir) == []
    assert cli_call(run_dir, "send_message", MESSAGE, attempt=2).returncode == 1, "attempt 2 starts with the state"
    runtime.run_set_state(run_dir, state="retrying", attempts=1)  # settled: the next attempt may start
    retried = cli_call(run_dir, "send_message", MESSAGE, attempt=None)
    assert retried.returncode == 0 and len(outbox_lines(run_dir)) == 1


def test_a_confirmation_for_other_receipt_bytes_is_ignored(run_dir):
    cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_effect")
    [receipt_path] = (run_dir / "receipts").iterdir()
    confirm(run_dir, receipt_path.stem, "committed")
    receipt_path.write_bytes(receipt_path.read_bytes() + b" ")
    resumed = cli_call(run_dir, "send_message", MESSAGE)
    assert resumed.returncode == 4 and json.loads(resumed.stdout)["status"] == "prepared"


@pytest.mark.parametrize("failpoint", ["after_prepared", "after_effect"])
def test_send_message_killed_at_a_failpoint_never_sends_twice(run_dir, failpoint):
    killed = cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT=failpoint)
    assert killed.returncode == 137
    lines_after_kill = len(outbox_lines(run_dir))
    assert lines_after_kill == (0 if failpoint == "after_prepared" else 1)
    for _ in range(3):
        resumed = cli_call(run_dir, "send_message", MESSAGE)
        assert resumed.returncode == 4, resumed.stdout
        assert json.loads(resumed.stdout)["status"] == "prepared"
    run_writer("replay", str(run_dir), "--json")
    assert len(outbox_lines(run_dir)) == lines_after_kill
    assert not [path for path in (run_dir / "receipts").iterdir() if path.name.endswith(".tmp")]
    read_ledger(run_dir)


def test_send_message_killed_before_the_rename_is_finished_from_its_temp_receipt(run_dir):
    killed = cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_temp_receipt")
    assert killed.returncode == 137
    [receipt_path] = (run_dir / "receipts").glob("*.json")
    [temp] = (run_dir / "receipts").glob(".*.tmp")
    assert receipt_of(run_dir, receipt_path.stem)["status"] == "prepared"
    temp_bytes = temp.read_bytes()
    resumed = cli_call(run_dir, "send_message", MESSAGE)
    assert resumed.returncode == 0, resumed.stderr
    output = json.loads(resumed.stdout)
    assert (output["status"], output["reused"]) == ("committed", True)
    assert receipt_path.read_bytes() == temp_bytes, "the rename was finished, not the receipt rewritten"
    [line] = outbox_lines(run_dir)
    assert output["result"]["remote_resource_id"] == line["message_id"] and line["call_id"] == receipt_path.stem
    assert [(e["status"], e.get("recovered")) for e in events_of(run_dir, "receipt")] == [
        ("prepared", None),
        ("committed", True),
    ]
    again = cli_call(run_dir, "send_message", MESSAGE)
    assert again.returncode == 0 and len(outbox_lines(run_dir)) == 1
    assert not list((run_dir / "receipts").glob(".*.tmp"))


@pytest.mark.parametrize(
    "change",
    [
        lambda receipt: receipt.update(status="unknown"),
        lambda receipt: receipt.update(args={"to": "someone@else", "body": "x"}),
        lambda receipt: receipt.update(output_sha256="0" * 64),
    ],
    ids=["not committed", "another call", "result not its digest"],
)
def test_a_temp_receipt_that_proves_nothing_is_removed_and_a_person_decides(run_dir, change):
    cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_temp_receipt")
    [temp] = (run_dir / "receipts").glob(".*.tmp")
    receipt = json.loads(temp.read_bytes())
    change(receipt)
    temp.write_text(json.dumps(receipt))
    resumed = cli_call(run_dir, "send_message", MESSAGE)
    assert resumed.returncode == 4 and json.loads(resumed.stdout)["status"] == "prepared"
    assert not list((run_dir / "receipts").glob(".*.tmp"))
    assert len(outbox_lines(run_dir)) == 1


@pytest.mark.parametrize("failpoint", CALL_FAILPOINTS)
def test_write_file_killed_at_a_failpoint_resumes_by_query(run_dir, failpoint):
    assert cli_call(run_dir, "write_file", FILE_ARGS, RECEIPTS_FAILPOINT=failpoint).returncode == 137
    temps_after_kill = list((run_dir / "receipts").glob(".*.tmp"))
    assert bool(temps_after_kill) == (failpoint == "after_temp_receipt")
    resumed = cli_call(run_dir, "write_file", FILE_ARGS)
    assert resumed.returncode == 0
    output = json.loads(resumed.stdout)
    # A finished temp receipt is the commit, or the query finds the file: nothing runs again.
    # Killed before the effect, the query finds no file and the effect runs now.
    assert output["status"] == "committed" and output["reused"] is (failpoint != "after_prepared")
    assert (run_dir / "workspace/src/app.py").read_text() == FILE_ARGS["content"]
    assert not list((run_dir / "receipts").glob(".*.tmp")), "the writer removes a crash's temp file"
    again = json.loads(cli_call(run_dir, "write_file", FILE_ARGS).stdout)
    assert again["reused"] is True and again["call_id"] == output["call_id"]
    statuses = [event["status"] for event in events_of(run_dir, "receipt")]
    assert statuses[0] == "prepared" and statuses[-1] == "committed"


def test_write_file_resumed_after_the_effect_does_not_write_again(run_dir):
    cli_call(run_dir, "write_file", FILE_ARGS, RECEIPTS_FAILPOINT="after_effect")
    target = run_dir / "workspace/src/app.py"
    mtime = target.stat().st_mtime_ns
    assert cli_call(run_dir, "write_file", FILE_ARGS).returncode == 0
    assert target.stat().st_mtime_ns == mtime, "the query found the effect, so nothing was re-run"


def test_cli_call_prints_the_interface_keys(run_dir):
    completed = cli_call(run_dir, "write_file", FILE_ARGS)
    assert set(json.loads(completed.stdout)) == {"call_id", "status", "reused", "result"}


def test_cli_refuses_a_directory_that_is_not_a_run(tmp_path):
    completed = cli_call(tmp_path, "write_file", FILE_ARGS)
    assert completed.returncode == 1 and b"not a run directory" in completed.stderr


def test_cli_refuses_bad_args_json_without_a_traceback(run_dir):
    completed = run_writer("call", str(run_dir), "--tool", "write_file", "--args", "{'a': 1}", "--attempt", "1")
    assert completed.returncode == 1 and b"Traceback" not in completed.stderr
    assert b"invalid JSON" in completed.stderr


def test_init_refuses_a_bad_run_id_and_a_bad_contract(tmp_path):
    assert run_writer("init", str(tmp_path / "bad$name"), "--contract-sha256", CONTRACT).returncode == 1
    assert run_writer("init", str(tmp_path / "ok"), "--contract-sha256", "xyz").returncode == 1
    assert run_writer("init", str(tmp_path / "ok"), "--contract-sha256", CONTRACT).returncode == 0
    assert json.loads((tmp_path / "ok" / "steer.json").read_bytes())["contract_sha256"] == CONTRACT
    assert run_writer("init", str(tmp_path / "ok"), "--contract-sha256", CONTRACT).returncode == 1


def test_a_tampered_committed_receipt_is_neither_reused_nor_run_again(run_dir):
    adapter = CountingAdapter()
    executor = runtime.Executor(run_dir, {"counting": adapter})
    outcome = executor.call("counting", {"x": 1}, attempt=1)
    path = run_dir / "receipts" / f"{outcome.call_id}.json"
    receipt = json.loads(path.read_bytes())
    receipt["args"] = {"x": 2}
    path.write_text(json.dumps(receipt))
    again = executor.call("counting", {"x": 1}, attempt=1)
    assert (again.status, again.reused, again.needs) == ("committed", False, "confirmation")
    assert adapter.executions == 1
    assert events_of(run_dir, "call_reused") == []


def test_an_adapter_must_be_registered_under_its_own_name(run_dir):
    with pytest.raises(ValueError, match="another name"):
        runtime.Executor(run_dir, {"other": CountingAdapter()})


OUTBOX_LIMIT = 64 * 1024


def send_with_room_left_in_the_outbox(run_dir: Path, room: int) -> subprocess.CompletedProcess[bytes]:
    """``call send_message`` in a child process whose files cannot grow past OUTBOX_LIMIT
    bytes (``ulimit -f``), with the outbox ``room`` bytes short of it. The ledger and
    receipts stay far below the limit."""
    (run_dir / "outbox.jsonl").write_bytes(b"x" * (OUTBOX_LIMIT - room - 1) + b"\n")
    args = ("call", str(run_dir), "--tool", "send_message", "--args", json.dumps(MESSAGE))
    return with_file_size_limit(OUTBOX_LIMIT, *args)


def test_a_short_write_to_the_outbox_is_unknown_never_committed(run_dir):
    completed = send_with_room_left_in_the_outbox(run_dir, room=40)
    assert completed.returncode == 4, completed.stderr
    output = json.loads(completed.stdout)
    assert (output["status"], output["needs"]) == ("unknown", "confirmation")
    assert "stopped short" in output["error"]["message"]
    outbox_size = (run_dir / "outbox.jsonl").stat().st_size
    assert outbox_size == OUTBOX_LIMIT, "part of the line went out: the outcome is unknown"
    assert receipt_of(run_dir, output["call_id"])["status"] == "unknown"
    assert [event["status"] for event in events_of(run_dir, "receipt")] == ["prepared", "unknown"]


def test_an_outbox_that_takes_no_byte_is_a_retryable_rejection(run_dir):
    completed = send_with_room_left_in_the_outbox(run_dir, room=0)
    assert completed.returncode == 3, completed.stderr
    output = json.loads(completed.stdout)
    assert output["status"] == "rejected" and output["error"]["kind"] == "retryable"
    assert (run_dir / "outbox.jsonl").stat().st_size == OUTBOX_LIMIT


def test_send_message_gives_the_target_the_call_id_and_records_its_message_id(run_dir):
    outcome = runtime.Executor(run_dir).call("send_message", MESSAGE, attempt=1)
    [line] = outbox_lines(run_dir)
    assert line["call_id"] == outcome.call_id and line["message_id"].startswith("msg-")
    assert (line["to"], line["body"]) == (MESSAGE["to"], MESSAGE["body"])
    assert receipt_of(run_dir, outcome.call_id)["result"]["remote_resource_id"] == line["message_id"]


def edit_committed_receipt(run_dir: Path, **changes) -> str:
    completed = cli_call(run_dir, "send_message", MESSAGE)
    assert completed.returncode == 0
    call_id = json.loads(completed.stdout)["call_id"]
    path = run_dir / "receipts" / f"{call_id}.json"
    receipt = json.loads(path.read_bytes())
    receipt.update(changes)
    path.write_text(json.dumps(receipt))
    return call_id


@pytest.mark.parametrize(
    "changes",
    [
        {"tool_version": "9.9.9"},
        {"contract_sha256": "e" * 64},
        {"attempt": 2},
        {"args": {"to": "ops@example.com", "body": "other"}},
        {"identity": "call-id-v1"},
        {"input_sha256": "0" * 64},
        {"call_id": "f" * 64},
    ],
    ids=lambda changes: next(iter(changes)),
)
def test_an_edited_committed_receipt_is_never_reused_and_the_exit_says_so(run_dir, changes):
    call_id = edit_committed_receipt(run_dir, **changes)
    completed = cli_call(run_dir, "send_message", MESSAGE)
    assert completed.returncode == 4, completed.stdout
    output = json.loads(completed.stdout)
    assert (output["call_id"], output["reused"], output["needs"]) == (call_id, False, "confirmation")
    assert "identity check" in output["error"]["message"]
    assert events_of(run_dir, "call_reused") == []
    assert len(outbox_lines(run_dir)) == 1
    [decision] = json.loads(run_writer("replay", str(run_dir), "--json").stdout)["decisions"]
    assert decision["decision"] == "confirm"


@pytest.mark.parametrize("content", [b"[]", b"{}", b'{"call_id": 5, "status": "committed"}', b'{"a": NaN}', b"\xff"])
def test_a_receipt_the_writer_cannot_read_is_one_line_of_error(run_dir, content):
    call_id = protocol.make_call_id(CONTRACT, 1, "send_message", MESSAGE, "1.0.0", "call-id-v2")
    (run_dir / "receipts" / f"{call_id}.json").write_bytes(content)
    completed = cli_call(run_dir, "send_message", MESSAGE)
    assert completed.returncode == 1 and completed.stdout == b""
    assert completed.stderr.count(b"\n") == 1 and b"Traceback" not in completed.stderr
    assert b"a person has to look" in completed.stderr
    assert outbox_lines(run_dir) == []


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("steer.json", b"[]"),
        ("steer.json", b"{}"),
        ("steer.json", b'{"contract_sha256": 7}'),
        ("state.json", b"[]"),
        ("state.json", b"{}"),
        ("state.json", b'{"name": "running", "attempts": "1"}'),
        ("state.json", b'{"name": "running", "attempts": 99999999999999999999999}'),
    ],
)
def test_run_files_the_writer_cannot_read_are_one_line_of_error(run_dir, name, content):
    (run_dir / name).write_bytes(content)
    completed = run_writer("call", str(run_dir), "--tool", "send_message", "--args", json.dumps(MESSAGE))
    assert completed.returncode == 1 and completed.stdout == b""
    assert completed.stderr.count(b"\n") == 1 and b"Traceback" not in completed.stderr
    assert outbox_lines(run_dir) == []


def test_the_attempt_comes_from_the_run_state(run_dir):
    running = json.loads(
        run_writer("call", str(run_dir), "--tool", "send_message", "--args", json.dumps(MESSAGE)).stdout
    )
    assert receipt_of(run_dir, running["call_id"])["attempt"] == 1
    runtime.run_set_state(run_dir, state="retrying", attempts=1)
    retrying = json.loads(
        run_writer("call", str(run_dir), "--tool", "send_message", "--args", json.dumps(MESSAGE)).stdout
    )
    assert receipt_of(run_dir, retrying["call_id"])["attempt"] == 2
    assert retrying["call_id"] != running["call_id"] and len(outbox_lines(run_dir)) == 2


@pytest.mark.parametrize("state", ["finished", "failed", "cancelled", "paused"])
def test_a_run_whose_state_refuses_calls_runs_none(run_dir, state):
    runtime.run_set_state(run_dir, state=state, attempts=1)
    completed = cli_call(run_dir, "send_message", MESSAGE)
    assert completed.returncode == 1 and f"the run is '{state}'".encode() in completed.stderr
    assert b"Traceback" not in completed.stderr
    assert outbox_lines(run_dir) == [] and list((run_dir / "receipts").iterdir()) == []


def test_call_id_v1_is_offered_for_runtimes_written_to_the_seed(tmp_path):
    run_dir = tmp_path / "seed-run"
    runtime.run_init(run_dir, contract_sha256=CONTRACT, identity="call-id-v1")
    args = ("call", str(run_dir), "--tool", "write_file", "--args", json.dumps(FILE_ARGS))
    completed = run_writer(*args)
    assert completed.returncode == 0, completed.stderr
    output = json.loads(completed.stdout)
    assert output["call_id"] == protocol.make_call_id(CONTRACT, 1, "write_file", FILE_ARGS)
    receipt = receipt_of(run_dir, output["call_id"])
    assert receipt["identity"] == "call-id-v1"
    again = run_writer(*args, "--identity", "call-id-v1")  # the caller may say which it expects
    assert json.loads(again.stdout)["reused"] is True


def cli_confirm(run_dir, call_id, **env):
    receipt_sha = protocol.sha256_hex((run_dir / "receipts" / f"{call_id}.json").read_bytes())
    return run_writer("confirm", str(run_dir), call_id, "--resolution", "committed", "--reason", "the mail log",
                      "--actor", "dana", "--receipt-sha256", receipt_sha, stdin=None, **env)  # fmt: skip


@pytest.mark.parametrize("then", ["confirm again", "call"])
def test_a_confirmation_killed_between_its_file_and_its_event_is_recorded_once(run_dir, then):
    """The delivery of a decision can be cut short after the file: whoever next takes the call's
    lock (the decision delivered again, or the runtime resuming) appends the one event missing."""
    assert cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    [receipt_path] = (run_dir / "receipts").iterdir()
    call_id = receipt_path.stem
    killed = cli_confirm(run_dir, call_id, RECEIPTS_FAILPOINT="after_confirmation_file")
    assert killed.returncode == 137
    assert (run_dir / "confirmations" / f"{call_id}.json").exists() and events_of(run_dir, "confirmation") == []
    if then == "confirm again":
        again = cli_confirm(run_dir, call_id)
        assert again.returncode == 0, again.stderr
        assert cli_confirm(run_dir, call_id).returncode == 0, "a third time changes nothing"
    else:
        resumed = cli_call(run_dir, "send_message", MESSAGE)
        assert resumed.returncode == 0 and json.loads(resumed.stdout)["reused"] is True
    [event] = events_of(run_dir, "confirmation")
    assert event["call_id"] == call_id and event["recovered"] is True
    assert len(outbox_lines(run_dir)) == 1
    read_ledger(run_dir)  # the chain holds


# --- what the writer can stand behind: results and arguments it can record and read back ----------


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(levels):
        value = {"inner": value}
    return value


class ReturningAdapter(CountingAdapter):
    """Makes its effect (counted), then returns what it was given to return."""

    def __init__(self, result: Any) -> None:
        super().__init__()
        self.result = result

    def execute(self, run_dir: Path, args: Any, call_id: str) -> Any:
        super().execute(run_dir, args, call_id)
        return self.result


@pytest.mark.parametrize(
    "result",
    [
        ["not", "an", "object"],
        {"amount": float("nan")},
        {"at": dt.datetime(2026, 12, 4, tzinfo=dt.UTC)},
        {"text": "\ud800"},
        {"tags": {"a", "b"}},
        deep(300),
        {"blob": "x" * (protocol.MAX_RESULT_BYTES + 1)},
    ],
    ids=["a-list", "nan", "a-datetime", "a-lone-surrogate", "a-set", "nested-300-deep", "over-the-size"],
)
def test_a_result_the_writer_cannot_record_leaves_the_call_unknown_never_committed(run_dir, result):
    """The effect ran; a result that is not a JSON object the reader reads back as written is no proof
    of anything: the call is unknown (done, recording incomplete: never run again), not committed,
    and no exception of the adapter's making escapes after the effect."""
    adapter = ReturningAdapter(result)
    executor = runtime.Executor(run_dir, {"counting": adapter})
    with pytest.raises(runtime.RecordingIncomplete) as raised:
        executor.call("counting", {"x": 1}, attempt=1)
    outcome = raised.value.outcome
    assert outcome.status == "unknown" and outcome.needs == "confirmation"
    assert "cannot be recorded" in outcome.error["message"]
    receipt = receipt_of(run_dir, outcome.call_id)
    assert receipt["status"] == "unknown" and "result" not in receipt
    again = executor.call("counting", {"x": 1}, attempt=1)
    assert again.needs == "confirmation" and adapter.executions == 1, "in doubt: a person decides, nothing runs twice"


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (deep(300), f"nesting deeper than {protocol.MAX_VALUE_DEPTH}"),
        (deep(protocol.MAX_VALUE_DEPTH), f"nesting deeper than {protocol.MAX_VALUE_DEPTH}"),
        ({"xs": [0] * protocol.MAX_VALUE_NODES}, "more than 250,000 values"),
        ({"text": "\udfff"}, "lone surrogate"),
        ({"amount": float("inf")}, "not JSON"),
        ({"blob": "x" * (protocol.MAX_ARGS_BYTES + 1)}, "larger than"),
    ],
    ids=["nested-300-deep", "one-past-the-limit", "too-many-values", "a-lone-surrogate", "infinity", "over-the-size"],
)
def test_arguments_the_writer_could_not_read_back_are_refused_before_anything_is_written(run_dir, args, problem):
    """Nested 300 deep, a call was committed once, and then every call of the run raised ValueError
    on reading its receipt, even after a person confirmed it."""
    adapter = CountingAdapter()
    executor = runtime.Executor(run_dir, {"counting": adapter})
    with pytest.raises(ValueError, match=problem):
        executor.call("counting", args, attempt=1)
    assert adapter.executions == 0 and list((run_dir / "receipts").iterdir()) == []
    assert executor.call("counting", {"x": 1}, attempt=1).status == "committed", "the run goes on"


def test_a_set_in_a_built_in_tools_args_is_refused_with_a_clear_error(run_dir):
    """It was a traceback from deep in the writer; nothing may be written for it."""
    with pytest.raises(ValueError, match="the arguments cannot be recorded: not JSON: Object of type set"):
        runtime.Executor(run_dir).call("write_file", {"path": "a.txt", "content": {1, 2}})
    assert list((run_dir / "receipts").iterdir()) == [] and not (run_dir / "workspace").exists()


def test_arguments_nested_too_deep_are_refused_through_the_command_line(run_dir):
    completed = cli_call(run_dir, "write_file", FILE_ARGS | {"extra": deep(300)})
    assert completed.returncode == 1 and b"nesting deeper than 256" in completed.stderr
    assert b"Traceback" not in completed.stderr and list((run_dir / "receipts").iterdir()) == []


def test_an_adapter_whose_evidence_raises_leaves_its_commit_to_a_person_and_reuse_does_not_crash(run_dir):
    class Broken(CountingAdapter):
        def evidence(self, run_dir: Path, args: Any, call_id: str, result: Any = None) -> Any:
            raise RuntimeError("the tracker's API changed")

    adapter = Broken()
    executor = runtime.Executor(run_dir, {"counting": adapter})
    assert executor.call("counting", {"x": 1}, attempt=1).status == "committed"
    again = executor.call("counting", {"x": 1}, attempt=1)
    assert again.needs == "confirmation" and "RuntimeError: the tracker's API changed" in (again.error or {})["message"]
    assert adapter.executions == 1


class EchoingAdapter(CountingAdapter):
    """Makes its effect (counted) and returns its arguments as its result."""

    def execute(self, run_dir: Path, args: Any, call_id: str) -> Any:
        super().execute(run_dir, args, call_id)
        return {"echo": args}


def test_what_the_writer_accepts_at_the_depth_limit_it_reads_back_everywhere(run_dir):
    """Issue 55, case 7: arguments nested 255 deep passed the check (256 levels), the effect ran,
    and the receipt (two levels more) could not be read back: the same call raised, replay said
    invalid_json. At the limit now, the receipt, the call again, replay and the reader all read
    it; the result nests one level deeper than the arguments and is accepted too."""
    from receipts.reader import read_run
    from receipts.replay import replay_run

    args = deep(protocol.MAX_VALUE_DEPTH - 2)  # its result, {"echo": args}, is at the limit
    assert protocol.json_depth({"echo": args}) == protocol.MAX_VALUE_DEPTH
    adapter = EchoingAdapter()
    executor = runtime.Executor(run_dir, {"counting": adapter})
    first = executor.call("counting", args, attempt=1)
    assert first.status == "committed"
    again = runtime.Executor(run_dir, {"counting": adapter}).call("counting", args, attempt=1)
    assert (again.status, again.reused, adapter.executions) == ("committed", True, 1)
    assert receipt_of(run_dir, first.call_id)["result"] == {"echo": args}
    replayed = replay_run(run_dir)
    assert "invalid_json" not in json.dumps(replayed), replayed
    files, events = read_run(run_dir)
    assert [call.call_id for call in files.calls] == [first.call_id] and len(events) == 4
    assert files.findings == [], files.findings
