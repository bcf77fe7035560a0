"""The review's ten attacks on the writer, each through the command line on real files.

Each gave a second effect or a false answer before the writer learnt to refuse
it: a receipt edited to say committed, a query that took "other content" for
"never happened", an effect in doubt repeated under a new call_id, a commit
whose ledger event a kill lost, keys merged by NFC, a task created in a
finished run, an exit code that invited a second effect, a capability read
from the file, and the small ones.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from receipts import durable, protocol, runtime
from receipts.demo import login_request, run_writer, writer_command, writer_env
from tests.helpers import CONTRACT
from tests.ledger import events_of, read_ledger
from tests.writer import (
    FILE_ARGS,
    MESSAGE,
    cli_call,
    cli_write_task,
    decisions,
    edit_receipt,
    finding_codes,
    only_receipt,
    outbox_lines,
    output,
    pad_ledger_to,
    receipt_of,
    with_file_size_limit,
)

# --- 1 and 2: a committed receipt is reused only with its evidence ----------------


def test_a_prepared_receipt_edited_to_committed_is_not_reused(run_dir):
    assert cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_prepared").returncode == 137
    call_id = only_receipt(run_dir)
    edit_receipt(run_dir, call_id, lambda receipt: receipt.update(status="committed"))

    completed = cli_call(run_dir, "send_message", MESSAGE)
    assert completed.returncode == 4, completed.stdout
    assert (output(completed)["reused"], output(completed)["needs"]) == (False, "confirmation")
    assert outbox_lines(run_dir) == [], "nothing was sent, and nothing is sent now"
    assert events_of(run_dir, "call_reused") == []
    assert decisions(run_dir)[call_id] == "confirm"
    assert {"identity_unverifiable", "committed_event_missing"} <= finding_codes(run_dir, call_id)


def test_an_edited_result_whose_file_is_gone_is_not_reused(run_dir):
    completed = cli_call(run_dir, "write_file", FILE_ARGS)
    call_id = output(completed)["call_id"]
    (run_dir / "workspace" / FILE_ARGS["path"]).unlink()
    edit_receipt(run_dir, call_id, lambda receipt: receipt["result"].update(file_sha256="e" * 64))

    again = cli_call(run_dir, "write_file", FILE_ARGS)
    assert again.returncode == 4 and output(again)["reused"] is False
    assert not (run_dir / "workspace" / FILE_ARGS["path"]).exists(), "neither reused nor run again"
    assert decisions(run_dir)[call_id] == "confirm"
    assert "output_digest_mismatch" in finding_codes(run_dir, call_id)


@pytest.mark.parametrize(
    ("tool", "args", "break_target"),
    [
        ("write_file", FILE_ARGS, lambda run: (run / "workspace" / FILE_ARGS["path"]).unlink()),
        ("write_file", FILE_ARGS, lambda run: (run / "workspace" / FILE_ARGS["path"]).write_text("other")),
        ("send_message", MESSAGE, lambda run: (run / "outbox.jsonl").write_bytes(b"")),
        (
            "send_message",
            MESSAGE,
            lambda run: (run / "outbox.jsonl").write_text(
                (run / "outbox.jsonl").read_text().replace("deployed", "gone")
            ),
        ),
    ],
    ids=["file deleted", "file rewritten", "outbox emptied", "outbox line edited"],
)
def test_a_forged_commit_with_a_consistent_digest_is_refused_when_the_target_disagrees(
    run_dir, tool, args, break_target
):
    """Even a result and output_sha256 rewritten to agree do not stand against the target."""
    call_id = output(cli_call(run_dir, tool, args))["call_id"]
    break_target(run_dir)
    before = receipt_of(run_dir, call_id)

    again = cli_call(run_dir, tool, args)
    assert again.returncode == 4, again.stdout
    assert output(again)["reused"] is False and "target" in output(again)["error"]["message"]
    assert receipt_of(run_dir, call_id) == before, "the receipt is left as it was, for a person to see"
    assert events_of(run_dir, "call_reused") == []
    [refusal] = events_of(run_dir, "reuse_refused")
    assert refusal["call_id"] == call_id
    assert decisions(run_dir)[call_id] == "confirm"
    assert "effect_not_shown" in finding_codes(run_dir, call_id)


def test_a_person_settles_a_refused_commit_and_the_writer_follows(run_dir):
    call_id = output(cli_call(run_dir, "send_message", MESSAGE))["call_id"]
    (run_dir / "outbox.jsonl").write_bytes(b"")
    assert cli_call(run_dir, "send_message", MESSAGE).returncode == 4
    receipt_sha = protocol.sha256_hex((run_dir / "receipts" / f"{call_id}.json").read_bytes())
    confirmed = run_writer(
        "confirm", str(run_dir), call_id, "--resolution", "committed", "--reason", "the mail log shows it",
        "--actor", "alice", "--receipt-sha256", receipt_sha,
    )  # fmt: skip
    assert confirmed.returncode == 0, confirmed.stderr
    again = cli_call(run_dir, "send_message", MESSAGE)
    assert again.returncode == 0 and output(again)["reused"] is True
    assert decisions(run_dir)[call_id] == "reuse"
    assert outbox_lines(run_dir) == []


# --- 3: a query answers only on positive evidence ------------------------------------


def test_a_query_never_reads_other_content_as_never_happened(run_dir):
    """A killed after its effect; B commits the same path; resuming A must not destroy B's effect."""
    a_args = {"path": "shared.txt", "content": "from A\n"}
    b_args = {"path": "shared.txt", "content": "from B\n"}
    assert cli_call(run_dir, "write_file", a_args, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    assert cli_call(run_dir, "write_file", b_args).returncode == 0

    resumed = cli_call(run_dir, "write_file", a_args)
    assert resumed.returncode == 4, resumed.stdout
    assert output(resumed)["status"] == "prepared" and output(resumed)["needs"] == "confirmation"
    assert "other bytes" in output(resumed)["error"]["message"]
    assert (run_dir / "workspace/shared.txt").read_text() == "from B\n", "B's committed effect stands"


def test_a_query_that_finds_the_file_absent_runs_the_effect(run_dir):
    assert cli_call(run_dir, "write_file", FILE_ARGS, RECEIPTS_FAILPOINT="after_prepared").returncode == 137
    resumed = cli_call(run_dir, "write_file", FILE_ARGS)
    assert resumed.returncode == 0 and output(resumed)["reused"] is False
    assert (run_dir / "workspace" / FILE_ARGS["path"]).read_text() == FILE_ARGS["content"]


# --- 4: an effect in doubt is never repeated under a new call_id ---------------------


def test_the_identity_formula_is_fixed_at_init(tmp_path):
    run = tmp_path / "run-v1"
    assert run_writer("init", str(run), "--contract-sha256", CONTRACT, "--identity", "call-id-v1").returncode == 0
    assert json.loads((run / "steer.json").read_bytes())["identity"] == "call-id-v1"
    first = cli_call(run, "write_file", FILE_ARGS)
    assert output(first)["call_id"] == protocol.make_call_id(CONTRACT, 1, "write_file", FILE_ARGS)
    refused = cli_call(run, "write_file", FILE_ARGS, 1, "--identity", "call-id-v2")
    assert refused.returncode == 1 and b"fixed at init" in refused.stderr


def test_calling_with_another_identity_cannot_send_an_in_doubt_message_again(run_dir):
    assert cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    completed = cli_call(run_dir, "send_message", MESSAGE, 1, "--identity", "call-id-v1")
    assert completed.returncode == 1 and b"call-id-v2" in completed.stderr
    assert len(outbox_lines(run_dir)) == 1


def test_a_new_attempt_is_refused_while_a_call_is_in_doubt(run_dir):
    assert cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    call_id = only_receipt(run_dir)

    refused = run_writer("state", str(run_dir), "retrying", "--attempts", "1")
    assert refused.returncode == 4 and call_id.encode() in refused.stdout + refused.stderr
    assert json.loads((run_dir / "state.json").read_bytes())["name"] == "running"

    # The state file edited by hand (or another runtime) does not get round it either.
    (run_dir / "state.json").write_text(json.dumps({"name": "retrying", "attempts": 1}))
    by_state = cli_call(run_dir, "send_message", MESSAGE, None)
    assert by_state.returncode == 4 and call_id in json.dumps(output(by_state)["error"])
    by_option = cli_call(run_dir, "send_message", MESSAGE, 2)
    assert by_option.returncode == 4
    assert len(outbox_lines(run_dir)) == 1, "the message in doubt was not sent a second time"


def test_an_override_needs_a_reason_and_is_on_the_ledger(run_dir):
    assert cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    call_id = only_receipt(run_dir)
    no_reason = run_writer("state", str(run_dir), "retrying", "--attempts", "1", "--override-unsettled", " ")
    assert no_reason.returncode == 1
    done = run_writer(
        "state", str(run_dir), "retrying", "--attempts", "1", "--override-unsettled", "the customer asked twice"
    )
    assert done.returncode == 0, done.stderr
    [override] = events_of(run_dir, "unsettled_override")
    assert override["call_ids"] == [call_id] and override["reason"] == "the customer asked twice"
    assert override["action"] == "state retrying, attempts 1"
    assert override["uid"] == os.geteuid(), "whose word it is: the writer's own user, in process"
    # The call at the new attempt must be overridden too, naming the same call.
    assert cli_call(run_dir, "send_message", MESSAGE, None).returncode == 4
    sent = cli_call(run_dir, "send_message", MESSAGE, None, "--override-unsettled", "sent again on purpose")
    assert sent.returncode == 0 and len(outbox_lines(run_dir)) == 2
    assert len(events_of(run_dir, "unsettled_override")) == 2


def test_a_settled_call_lets_the_next_attempt_go(run_dir):
    assert cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_prepared").returncode == 137
    call_id = only_receipt(run_dir)
    receipt_sha = protocol.sha256_hex((run_dir / "receipts" / f"{call_id}.json").read_bytes())
    runtime.confirm_call(
        run_dir, call_id, resolution="rejected", reason="never left", actor="alice", receipt_sha256=receipt_sha
    )
    assert run_writer("state", str(run_dir), "retrying", "--attempts", "1").returncode == 0
    retried = cli_call(run_dir, "send_message", MESSAGE, None)
    assert retried.returncode == 0 and len(outbox_lines(run_dir)) == 1


# --- 5: a kill between the committed rename and its event ------------------------------


@pytest.mark.parametrize(("tool", "args"), [("send_message", MESSAGE), ("write_file", FILE_ARGS)])
def test_a_commit_whose_event_a_kill_lost_gets_it_back_marked_recovered(run_dir, tool, args):
    killed = cli_call(run_dir, tool, args, RECEIPTS_FAILPOINT="after_commit_rename")
    assert killed.returncode == 137
    call_id = only_receipt(run_dir)
    assert receipt_of(run_dir, call_id)["status"] == "committed", "the kill landed after the rename"
    assert [event["status"] for event in events_of(run_dir, "receipt")] == ["prepared"], "and before the event"
    assert "committed_event_missing" in finding_codes(run_dir, call_id)

    again = cli_call(run_dir, tool, args)
    assert again.returncode == 0 and output(again)["reused"] is True
    assert [(event["status"], event.get("recovered")) for event in events_of(run_dir, "receipt")] == [
        ("prepared", None),
        ("committed", True),
    ]
    assert "committed_event_missing" not in finding_codes(run_dir)
    cli_call(run_dir, tool, args)
    assert len(events_of(run_dir, "receipt")) == 2, "recovered once, not at every touch"


# --- 6: keys that collide after NFC ------------------------------------------------------


@pytest.mark.parametrize("keys", [("e\u0301", "\u00e9"), ("\u00e9", "e\u0301"), ("a\r\nb", "a\nb")])
def test_keys_that_collide_after_normalising_are_refused_never_merged(run_dir, keys):
    request = login_request(references={keys[0]: "first", keys[1]: "second"})
    completed = cli_write_task(run_dir, request)
    assert completed.returncode == 1 and b"Traceback" not in completed.stderr
    assert b"same key after normalising" in completed.stderr
    assert list((run_dir / "tasks").iterdir()) == [] and list((run_dir / "submissions").iterdir()) == []


def test_a_stored_request_with_colliding_keys_is_a_finding_not_a_crash(run_dir):
    runtime.write_task(run_dir, login_request(), "sub-1")
    [record_path] = (run_dir / "submissions").iterdir()
    record = json.loads(record_path.read_bytes())
    record["request"]["references"] = {"e\u0301": 1, "\u00e9": 2}
    record_path.write_text(json.dumps(record))
    assert "schema_error" in finding_codes(run_dir)


# --- 7: write-task obeys the run's state, and a lock is never swept from under a writer ----


@pytest.mark.parametrize("state", [b'{"name": "finished", "attempts": 1}', b"[]", b"{not json"])
def test_write_task_obeys_the_same_gate_as_call(run_dir, state):
    (run_dir / "state.json").write_bytes(state)
    completed = cli_write_task(run_dir, login_request())
    assert completed.returncode == 1 and b"Traceback" not in completed.stderr
    assert list((run_dir / "tasks").iterdir()) == []
    legacy = cli_write_task(run_dir, login_request(), submission_id=None)
    assert legacy.returncode == 1 and list((run_dir / "tasks").iterdir()) == []


def started(*args: str, stdin: bytes) -> subprocess.Popen[bytes]:
    """The writer in a child process, its standard input given and closed."""
    child = subprocess.Popen(writer_command(*args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=writer_env())
    assert child.stdin is not None
    child.stdin.write(stdin)
    child.stdin.close()
    return child


def disposition_of(child: subprocess.Popen[bytes]) -> str:
    assert child.stdout is not None
    with child.stdout:
        out = child.stdout.read()
    assert child.wait(timeout=30) == 0, out
    return json.loads(out)["disposition"]


def held(lock_path: Path) -> int:
    """Take a writer's lock the way a writer at work holds it: an open file with an exclusive flock."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


SUBMISSION = ("write-task", "--request", "-", "--submission-id", "sub-1")


def write_task_args(run_dir: Path) -> tuple[str, ...]:
    return (SUBMISSION[0], str(run_dir), *SUBMISSION[1:])


def submission_lock(run_dir: Path) -> Path:
    return run_dir / ".writer" / f"submission-{protocol.submission_key('sub-1')}.lock"


@pytest.mark.django_db
def test_the_lock_sweep_never_removes_a_lock_a_writer_holds(run_dir):
    from evidence.models import Run
    from evidence.retention import actions

    run = Run.objects.create(run_id=run_dir.name, path=str(run_dir))
    lock = submission_lock(run_dir)
    fd = held(lock)  # a writer at work on sub-1
    try:
        actions.sweep_writer_locks(run)
        assert lock.exists(), "a lock a writer holds is never removed"
        second = started(*write_task_args(run_dir), stdin=json.dumps(login_request()).encode())
        time.sleep(0.5)
        assert second.poll() is None, "the next writer waits for the holder, on the same file"
    finally:
        os.close(fd)
    assert disposition_of(second) == "created"
    assert actions.sweep_writer_locks(run) >= 1 and not lock.exists(), "a free lock is swept"


def test_a_writer_that_waited_on_a_swept_lock_takes_the_new_one(run_dir):
    """A sweep unlinked the lock while a writer waited on it, and a third took a new lock file at
    the same path: the waiter must not go on as if it held the submission's lock."""
    request = json.dumps(login_request()).encode()
    lock = submission_lock(run_dir)
    old = held(lock)
    waiter = started(*write_task_args(run_dir), stdin=request)
    time.sleep(0.5)  # the waiter has opened the old lock file and blocks on it
    lock.unlink()  # what a sweep that takes no lock did
    new = held(lock)  # the next writer at work, on the new file
    os.close(old)
    try:
        time.sleep(0.5)
        assert waiter.poll() is None, "the waiter saw its lock file replaced and waits on the new one"
    finally:
        os.close(new)
    assert disposition_of(waiter) == "created"


# --- 8: a done effect never exits as if nothing happened ----------------------------------

LIMIT = 64 * 1024


def test_a_legacy_task_whose_event_does_not_fit_exits_done_unrecorded(run_dir):
    pad_ledger_to(run_dir, LIMIT - 20)
    request = json.dumps(login_request()).encode()
    completed = with_file_size_limit(LIMIT, "write-task", str(run_dir), "--request", "-", stdin=request)
    assert completed.returncode == 5, completed.stderr
    assert output(completed)["task_id"] == "TASK-000001" and output(completed)["action_taken"] is True
    assert b"do not retry" in completed.stderr
    assert [path.name for path in (run_dir / "tasks").iterdir()] == ["TASK-000001.md"]
    read_ledger(run_dir)


def test_a_sent_message_whose_event_does_not_fit_exits_done_unrecorded(run_dir):
    # Room for the prepared event (about 200 bytes) and not for the committed one.
    pad_ledger_to(run_dir, LIMIT - 300)
    completed = with_file_size_limit(
        LIMIT, "call", str(run_dir), "--tool", "send_message", "--args", json.dumps(MESSAGE)
    )
    assert completed.returncode == 5, completed.stderr
    assert output(completed)["status"] == "committed" and b"do not retry" in completed.stderr
    assert len(outbox_lines(run_dir)) == 1
    assert [event["status"] for event in events_of(run_dir, "receipt")] == ["prepared"]
    # The lost event comes back at the next touch, which sends nothing.
    again = cli_call(run_dir, "send_message", MESSAGE, None)
    assert again.returncode == 0 and output(again)["reused"] is True and len(outbox_lines(run_dir)) == 1
    assert [event.get("recovered") for event in events_of(run_dir, "receipt")] == [None, True]


# --- 9: the adapter's capability decides, not the file ----------------------------------------


@pytest.mark.parametrize(("tool", "args", "claim", "expected"), [
    ("send_message", MESSAGE, True, "confirm"),
    ("write_file", FILE_ARGS, False, "query"),
])  # fmt: skip
def test_queryable_comes_from_the_adapter_not_the_receipt(run_dir, tool, args, claim, expected):
    assert cli_call(run_dir, tool, args, RECEIPTS_FAILPOINT="after_prepared").returncode == 137
    call_id = only_receipt(run_dir)
    edit_receipt(run_dir, call_id, lambda receipt: receipt.update(queryable=claim))
    assert decisions(run_dir)[call_id] == expected


# --- 10: the small ones ----------------------------------------------------------------------------


def test_negative_attempts_are_refused(tmp_path, run_dir):
    assert run_writer("init", str(tmp_path / "neg"), "--contract-sha256", CONTRACT, "--attempts", "-5").returncode == 1
    assert not (tmp_path / "neg").exists()
    for attempts in ("-1", "0"):
        refused = run_writer("state", str(run_dir), "retrying", "--attempts", attempts)
        assert refused.returncode == 1 and b"Traceback" not in refused.stderr
    assert json.loads((run_dir / "state.json").read_bytes())["attempts"] == 1


def test_a_commit_found_by_a_query_says_reused(run_dir):
    assert cli_call(run_dir, "write_file", FILE_ARGS, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    resumed = cli_call(run_dir, "write_file", FILE_ARGS)
    assert resumed.returncode == 0 and output(resumed)["reused"] is True, "nothing ran this time"


def old_temp_beside(path: Path, hours: float) -> Path:
    temp = path.with_name(durable.temp_name_for(path.name))
    temp.parent.mkdir(parents=True, exist_ok=True)
    temp.write_bytes(b"half")
    then = time.time() - hours * 3600
    os.utime(temp, (then, then))
    return temp


def test_temp_files_left_by_kills_are_swept_once_old(run_dir):
    task = run_dir / "tasks" / "TASK-000001.md"
    workspace_file = run_dir / "workspace" / FILE_ARGS["path"]
    old_task, old_file = old_temp_beside(task, 2), old_temp_beside(workspace_file, 2)
    young_task = old_temp_beside(task, 0)

    # Beside what it writes, the writer sweeps as it goes.
    assert cli_write_task(run_dir, login_request(), "sub-1").returncode == 0
    assert cli_call(run_dir, "write_file", FILE_ARGS).returncode == 0
    assert not old_task.exists() and not old_file.exists()
    assert young_task.exists(), "a young temp may belong to a writer at work: it stays"

    # A legacy task killed before its link leaves a temp under a number nobody writes again.
    orphans = [old_temp_beside(run_dir / "tasks/TASK-000007.md", 2), old_temp_beside(run_dir / "workspace/a/b/c", 2)]
    swept = run_writer("sweep", str(run_dir))
    assert swept.returncode == 0, swept.stderr
    assert not any(path.exists() for path in orphans) and young_task.exists()
    assert sorted(json.loads(swept.stdout)["temp_files"]) == sorted(str(path.relative_to(run_dir)) for path in orphans)


# --- a second review, after the ten: each of these broke the rules above ---------------------------


def test_an_effect_in_doubt_at_a_later_attempt_is_not_made_again_at_an_earlier_one(run_dir):
    runtime.run_set_state(run_dir, state="running", attempts=2)
    assert cli_call(run_dir, "send_message", MESSAGE, None, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    lowered = run_writer("state", str(run_dir), "running", "--attempts", "1")
    assert lowered.returncode == 1 and b"attempts only grow" in lowered.stderr
    earlier = cli_call(run_dir, "send_message", MESSAGE, 1)
    assert earlier.returncode == 4 and output(earlier)["error"]["kind"] == "unsettled"
    later = cli_call(run_dir, "send_message", MESSAGE, 3)
    assert later.returncode == 1 and b"the run's attempt, 2" in later.stderr
    assert len(outbox_lines(run_dir)) == 1


@pytest.mark.parametrize(
    "between",
    [[], [("failed", "1")], [("paused", "2"), ("failed", "2")]],
    ids=["straight-back", "through-a-state-that-runs-nothing", "through-two"],
)
def test_a_retry_stepped_back_to_the_attempt_it_retried_sends_nothing_twice(run_dir, between):
    """retrying/1 runs calls at attempt 2 and running/1 at attempt 1: the number in state.json did
    not go down, the attempt a call runs at did, and the message went out again under attempt 1's
    call_id. A state that runs no call in between must not launder the step back either."""
    assert run_writer("state", str(run_dir), "retrying", "--attempts", "1").returncode == 0
    assert cli_call(run_dir, "send_message", MESSAGE, None, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    for state, attempts in between:
        assert run_writer("state", str(run_dir), state, "--attempts", attempts).returncode == 0
    back = run_writer("state", str(run_dir), "running", "--attempts", "1")
    assert back.returncode == 1 and b"attempts only grow" in back.stderr and b"attempt 2" in back.stderr
    assert cli_call(run_dir, "send_message", MESSAGE, None).returncode != 0
    # state.json set back by hand, the mark of the attempt reached left: the call is refused.
    state_file = run_dir / "state.json"
    state_file.write_text(json.dumps(json.loads(state_file.read_text()) | {"name": "running", "attempts": 1}))
    by_hand = cli_call(run_dir, "send_message", MESSAGE, None)
    assert by_hand.returncode == 1 and b"calls have run at attempt 2" in by_hand.stderr
    assert len(outbox_lines(run_dir)) == 1
    # Forward is still open, and waits for the call in doubt as any new attempt does.
    assert run_writer("state", str(run_dir), "retrying", "--attempts", "1").returncode == 0
    ahead = run_writer("state", str(run_dir), "retrying", "--attempts", "2")
    assert ahead.returncode == 4 and b"in doubt" in ahead.stderr


@pytest.mark.parametrize("tool", ["send_message", "write_file"])
def test_a_kill_before_the_first_receipt_lands_leaves_a_call_that_runs(run_dir, tool):
    """Found by the kill harness: the mark that a receipt was put in place went down before the
    rename, so a kill in between made the next call wait for a person over nothing at all."""
    args = MESSAGE if tool == "send_message" else FILE_ARGS
    assert cli_call(run_dir, tool, args, RECEIPTS_FAILPOINT="after_prepared_temp").returncode == 137
    assert not list((run_dir / "receipts").glob("*.json"))
    again = cli_call(run_dir, tool, args)
    assert again.returncode == 0 and output(again)["status"] == "committed"
    if tool == "send_message":
        assert len(outbox_lines(run_dir)) == 1


def test_a_receipt_removed_after_its_effect_is_never_run_again(run_dir):
    assert cli_call(run_dir, "send_message", MESSAGE).returncode == 0
    for receipt in (run_dir / "receipts").iterdir():
        receipt.unlink()
    again = cli_call(run_dir, "send_message", MESSAGE)
    assert again.returncode == 4 and "receipt is gone" in output(again)["error"]["message"]
    assert len(outbox_lines(run_dir)) == 1
    # Nor at the next attempt, reached by a state.json edited by hand.
    (run_dir / "state.json").write_text(json.dumps({"name": "retrying", "attempts": 1}))
    assert cli_call(run_dir, "send_message", MESSAGE, None).returncode == 4
    assert len(outbox_lines(run_dir)) == 1


def test_init_never_remakes_a_run_whose_steer_is_gone(tmp_path):
    run = tmp_path / "run-v1"
    runtime.run_init(run, contract_sha256=CONTRACT, identity="call-id-v1")
    assert cli_call(run, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    (run / "steer.json").unlink()
    again = run_writer("init", str(run), "--contract-sha256", CONTRACT)
    assert again.returncode == 1 and b"not empty" in again.stderr
    assert not (run / "steer.json").exists()


def test_a_message_after_a_torn_outbox_line_gets_a_line_of_its_own(run_dir):
    (run_dir / "outbox.jsonl").write_bytes(b'{"body":"first","call_id":"torn by a full dis')  # a short write
    sent = cli_call(run_dir, "send_message", MESSAGE)
    assert sent.returncode == 0
    lines = (run_dir / "outbox.jsonl").read_bytes().split(b"\n")
    assert lines[0].startswith(b'{"body":"first"') and json.loads(lines[1])["call_id"] == output(sent)["call_id"]
    again = cli_call(run_dir, "send_message", MESSAGE)
    assert again.returncode == 0 and output(again)["reused"] is True, "its target shows it"


def test_an_unknown_outcome_that_cannot_be_recorded_still_waits_for_a_person(run_dir, tmp_path):
    """The outbox takes part of the line and the receipt saying unknown does not fit: exit 4, never 1."""
    body = "b" * 3000
    message = {"to": "boss@example.com", "body": body}
    probe = tmp_path / "probe"
    runtime.run_init(probe, contract_sha256=CONTRACT)
    assert cli_call(probe, "send_message", message, RECEIPTS_FAILPOINT="after_prepared").returncode == 137
    prepared_size = (probe / "receipts" / f"{only_receipt(probe)}.json").stat().st_size
    limit = prepared_size + 40  # the prepared receipt fits; the unknown one, with its error, does not
    (run_dir / "outbox.jsonl").write_bytes(b"x" * (limit - 101) + b"\n")
    completed = with_file_size_limit(
        limit, "call", str(run_dir), "--tool", "send_message", "--args", json.dumps(message), "--attempt", "1"
    )
    assert completed.returncode == 4, completed.stderr
    assert "recording that the outcome is unknown failed" in output(completed)["error"]["message"]
    assert (run_dir / "outbox.jsonl").stat().st_size == limit, "part of the line went out"
    assert receipt_of(run_dir, output(completed)["call_id"])["status"] == "prepared"


def test_a_commit_finished_from_its_temp_receipt_is_reused_only_if_its_target_shows_it(run_dir):
    assert cli_call(run_dir, "write_file", FILE_ARGS, RECEIPTS_FAILPOINT="after_temp_receipt").returncode == 137
    (run_dir / "workspace" / FILE_ARGS["path"]).unlink()
    resumed = cli_call(run_dir, "write_file", FILE_ARGS)
    assert resumed.returncode == 4 and "target" in output(resumed)["error"]["message"]
    assert receipt_of(run_dir, output(resumed)["call_id"])["status"] == "committed", "the rename was finished"
    assert [event["call_id"] for event in events_of(run_dir, "reuse_refused")] == [output(resumed)["call_id"]]
    assert decisions(run_dir)[output(resumed)["call_id"]] == "confirm"


def test_a_path_named_like_a_temp_file_is_refused_and_an_old_dotfile_is_never_swept(run_dir):
    refused = cli_call(run_dir, "write_file", {"path": "sub/.notes.txt.123.cafebabe.tmp", "content": "x"})
    assert refused.returncode == 3 and "temp files" in output(refused)["error"]["message"]
    kept = {"path": ".notes.txt.1.cafe.tmp", "content": "B: keep me"}  # not the writer's pattern
    assert cli_call(run_dir, "write_file", kept).returncode == 0
    target = run_dir / "workspace" / kept["path"]
    then = time.time() - 7200
    os.utime(target, (then, then))
    assert cli_call(run_dir, "write_file", {"path": "notes.txt", "content": "A"}).returncode == 0
    assert run_writer("sweep", str(run_dir)).returncode == 0
    assert target.read_text() == "B: keep me"


def test_an_outbox_of_any_size_is_read_whole(run_dir):
    with (run_dir / "outbox.jsonl").open("wb") as outbox:
        outbox.write((b'{"pad": "' + b"x" * 1_048_000 + b'"}\n') * 65)  # past 64 MiB
    sent = cli_call(run_dir, "send_message", MESSAGE)
    assert sent.returncode == 0
    again = cli_call(run_dir, "send_message", MESSAGE)
    assert again.returncode == 0 and output(again)["reused"] is True


def test_a_result_that_is_not_an_object_is_a_person_s_to_settle_not_a_traceback(run_dir):
    call_id = output(cli_call(run_dir, "write_file", FILE_ARGS))["call_id"]
    edit_receipt(
        run_dir, call_id, lambda receipt: receipt.update(result=["x"], output_sha256=protocol.input_sha256(["x"]))
    )
    assert decisions(run_dir)[call_id] == "confirm"
    again = cli_call(run_dir, "write_file", FILE_ARGS)
    assert again.returncode == 4 and b"Traceback" not in again.stderr
    digest = protocol.sha256_hex((run_dir / "receipts" / f"{call_id}.json").read_bytes())
    confirmed = run_writer(
        "confirm", str(run_dir), call_id, "--resolution", "committed", "--reason", "checked",
        "--actor", "alice", "--receipt-sha256", digest,
    )  # fmt: skip
    assert confirmed.returncode == 0, confirmed.stderr


# --- issue 55, case 8: an exit code never says "nothing was done" after an effect ---------------


def test_a_committed_call_whose_event_cannot_be_written_again_exits_5_not_1(run_dir, tmp_path):
    """The committed receipt is in place and its ledger line hit a full disk (exit 5). The same
    call again, the disk still full, tried to append the lost line, failed, and exited 1:
    "nothing was done, fix the input", for a call whose effect happened."""
    import shutil

    pad_ledger_to(run_dir, 20_000)  # the ledger is the largest file: the limit is its
    probe = tmp_path / "probe"
    shutil.copytree(run_dir, probe)
    assert cli_call(probe, "write_file", FILE_ARGS).returncode == 0
    added = (probe / protocol.LEDGER_NAME).read_bytes()[20_000:].splitlines(keepends=True)
    assert [json.loads(line)["status"] for line in added] == ["prepared", "committed"]
    limit = 20_000 + len(added[0]) + len(added[1]) // 2  # the prepared line fits, the committed one not

    def call_on_a_full_disk() -> subprocess.CompletedProcess[bytes]:
        return with_file_size_limit(limit, "call", str(run_dir), "--tool", "write_file", "--args",
                                    json.dumps(FILE_ARGS), "--attempt", "1")  # fmt: skip

    first = call_on_a_full_disk()
    assert first.returncode == 5, first.stderr
    call_id = output(first)["call_id"]
    assert receipt_of(run_dir, call_id)["status"] == "committed"
    again = call_on_a_full_disk()
    assert again.returncode == 5, again.stderr
    assert (output(again)["call_id"], output(again)["status"]) == (call_id, "committed")
    assert b"do not retry" in again.stderr
    healed = cli_call(run_dir, "write_file", FILE_ARGS)
    assert healed.returncode == 0 and output(healed)["reused"] is True
    assert [event["status"] for event in events_of(run_dir, "receipt")] == ["prepared", "committed"]
    read_ledger(run_dir)


def test_a_call_in_doubt_on_a_run_its_user_cannot_write_exits_4_not_1(shared_tmp, users):
    """A call in doubt (killed after its prepared receipt), asked again by a user who may read the
    run but not write it: the writer could not take the call's lock and exited 1, "nothing was
    done", though the message may have gone out. Now: 4, the call named, a person decides."""
    from tests.served import as_user

    _, agent = users
    run = shared_tmp / "run"
    runtime.run_init(run, contract_sha256=CONTRACT)
    assert cli_call(run, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_prepared").returncode == 137
    call_id = only_receipt(run)
    completed = as_user(agent, "call", str(run), "--tool", "send_message", "--args", json.dumps(MESSAGE),
                        "--attempt", "1")  # fmt: skip
    assert completed.returncode == 4, completed.stderr
    document = output(completed)
    assert (document["call_id"], document["status"], document["needs"]) == (call_id, "prepared", "confirmation")
    assert "Permission" in document["error"]["message"]
    # A new call on that run did nothing, and says so: 1 is right there.
    other = as_user(agent, "call", str(run), "--tool", "send_message", "--args",
                    json.dumps(MESSAGE | {"body": "another"}), "--attempt", "1")  # fmt: skip
    assert other.returncode == 1, other.stderr
    assert outbox_lines(run) == []
