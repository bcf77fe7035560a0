"""Driving the writer as a runtime would, through its command line on real files, and reading back what it left."""

from __future__ import annotations

import json
import resource
import subprocess
from collections.abc import Callable
from pathlib import Path

from receipts import protocol
from receipts.demo import run_writer, writer_command, writer_env
from receipts.reader import read_run

MESSAGE = {"to": "ops@example.com", "body": "deployed"}
FILE_ARGS = {"path": "src/app.py", "content": "print('hi')\n"}


def cli_call(run_dir: Path, tool: str, args: dict, attempt: int | None = 1, *extra: str, **env: str):
    """``python -m receipts call``; ``attempt=None`` lets the run's state choose it."""
    options = ["--attempt", str(attempt)] if attempt is not None else []
    return run_writer(
        "call", str(run_dir), "--tool", tool, "--args", json.dumps(args), *options, *extra, stdin=None, **env
    )


def cli_write_task(run_dir: Path, request: dict, submission_id: str | None = "sub-1", **env: str):
    args = ["write-task", str(run_dir), "--request", "-"]
    if submission_id is not None:
        args += ["--submission-id", submission_id]
    return run_writer(*args, stdin=json.dumps(request).encode(), **env)


def receipt_path(run_dir: Path, call_id: str) -> Path:
    return run_dir / "receipts" / f"{call_id}.json"


def receipt_of(run_dir: Path, call_id: str) -> dict:
    return json.loads(receipt_path(run_dir, call_id).read_bytes())


def edit_receipt(run_dir: Path, call_id: str, change: Callable[[dict], object]) -> None:
    """Edit a receipt in place, as an agent that can write under ``receipts/`` would."""
    receipt = receipt_of(run_dir, call_id)
    change(receipt)
    receipt_path(run_dir, call_id).write_text(json.dumps(receipt, indent=2, sort_keys=True) + "\n")


def only_receipt(run_dir: Path) -> str:
    [path] = (run_dir / "receipts").glob("*.json")
    return path.stem


def outbox_lines(run_dir: Path) -> list[dict]:
    path = run_dir / "outbox.jsonl"
    return [json.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def decisions(run_dir: Path) -> dict[str, str]:
    """call_id -> the decision ``python -m receipts replay`` gives it."""
    completed = run_writer("replay", str(run_dir), "--json")
    assert completed.returncode == 0, completed.stderr
    return {row["call_id"]: row["decision"] for row in json.loads(completed.stdout)["decisions"]}


def finding_codes(run_dir: Path, call_id: str | None = None) -> set[str]:
    """The codes the reader reports for the run (or for one call)."""
    files, _ = read_run(run_dir, keep_events=False)
    return {finding.code for finding in files.findings if call_id is None or finding.call_id == call_id}


def output(completed: subprocess.CompletedProcess[bytes]) -> dict:
    return json.loads(completed.stdout)


def with_file_size_limit(limit: int, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """The writer in a child process whose files cannot grow past ``limit`` bytes (``ulimit -f``)."""

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        writer_command(*args),
        input=stdin,
        capture_output=True,
        env=writer_env(),
        preexec_fn=limit_file_size,
        check=False,
    )


def pad_ledger_to(run_dir: Path, size: int) -> None:
    """Append one valid, chained event that makes the ledger exactly ``size`` bytes long."""
    from receipts import durable

    ledger = run_dir / protocol.LEDGER_NAME
    seq = len(ledger.read_bytes().splitlines()) + 1
    # Every field but the padding has a fixed length: seq's digits, a time to the microsecond, a digest.
    bare = {"seq": seq, "ts": protocol.format_time(protocol.utc_now()), "type": "padding", "prev_sha256": "0" * 64}
    room = size - ledger.stat().st_size - len(protocol.canonical_json(bare | {"fill": ""})) - 1
    assert room >= 0, "the ledger is already too long"
    durable.append_event(run_dir, "padding", {"fill": "x" * room})
    assert ledger.stat().st_size == size, "the padding did not land on the size asked for"
