"""The executor: receipts around tool calls, reuse, recovery, and real kills at failpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

from receipts import protocol, runtime
from receipts.demo import run_writer
from tests.conftest import CONTRACT
from tests.ledger import events_of, read_ledger

CALL_FAILPOINTS = ["after_prepared", "after_effect", "after_temp_receipt"]
MESSAGE = {"to": "ops@example.com", "body": "deployed"}
FILE_ARGS = {"path": "src/app.py", "content": "print('hi')\n"}


def cli_call(run_dir: Path, tool: str, args: dict, attempt: int = 1, **env: str):
    return run_writer(
        "call", str(run_dir), "--tool", tool, "--args", json.dumps(args), "--attempt", str(attempt), **env
    )


def receipt_of(run_dir: Path, call_id: str) -> dict:
    return json.loads((run_dir / "receipts" / f"{call_id}.json").read_bytes())


def outbox_lines(run_dir: Path) -> list[dict]:
    path = run_dir / "outbox.jsonl"
    return [json.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


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

    def execute(self, run_dir: Path, args: dict[str, Any], call_id: str) -> dict[str, Any]:
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
    assert outcome.status == "rejected" and outcome.error["kind"] == "permanent"
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
        "confirmation_id": runtime.confirmation_id(call_id, resolution, digest),
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
    retried = cli_call(run_dir, "send_message", MESSAGE, attempt=2)
    assert retried.returncode == 0 and len(outbox_lines(run_dir)) == 1


def test_a_confirmation_for_other_receipt_bytes_is_ignored(run_dir):
    cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_effect")
    [receipt_path] = (run_dir / "receipts").iterdir()
    confirm(run_dir, receipt_path.stem, "committed")
    receipt_path.write_bytes(receipt_path.read_bytes() + b" ")
    resumed = cli_call(run_dir, "send_message", MESSAGE)
    assert resumed.returncode == 4 and json.loads(resumed.stdout)["status"] == "prepared"


@pytest.mark.parametrize("failpoint", CALL_FAILPOINTS)
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


@pytest.mark.parametrize("failpoint", CALL_FAILPOINTS)
def test_write_file_killed_at_a_failpoint_resumes_by_query(run_dir, failpoint):
    assert cli_call(run_dir, "write_file", FILE_ARGS, RECEIPTS_FAILPOINT=failpoint).returncode == 137
    temps_after_kill = list((run_dir / "receipts").glob(".*.tmp"))
    assert bool(temps_after_kill) == (failpoint == "after_temp_receipt")
    resumed = cli_call(run_dir, "write_file", FILE_ARGS)
    assert resumed.returncode == 0
    output = json.loads(resumed.stdout)
    assert output["status"] == "committed" and output["reused"] is False
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
