"""Task creation at most once per client_submission_id: reserved -> task_created -> committed.

Standard library only. The rules are RUN_DIRECTORY.md's; each step is
persisted before the next, under a lock per submission and one for task numbers.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.confined import UnsafePath, read_file, read_json_file
from receipts.durable import (
    append_event,
    create_durable,
    exclusive_lock,
    failpoint,
    json_file,
    read_events,
    recording,
    remove_old_temp_files,
    write_durable,
)
from receipts.protocol import DIGEST_SCHEMA, WRITER_DIR, format_time, sha256_hex, utc_now
from receipts.runs import next_attempt
from receipts.signing import key_for_run

TASK_NUMBER_LOCK = "task-number.lock"
TASK_COUNTER = "task-counter"


@dataclasses.dataclass(frozen=True)
class TaskResult:
    disposition: str
    action_taken: bool
    task_id: str | None
    task_path: str | None
    legacy: bool = False
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _allocate_task_id(run_dir: Path) -> str:
    """The next task number, persisted before use so no two callers share one."""
    writer = run_dir / WRITER_DIR
    with exclusive_lock(writer / TASK_NUMBER_LOCK, root=run_dir):
        counter = read_json_file(writer / TASK_COUNTER, run_dir)
        number = counter.get("next") if isinstance(counter, dict) else 1 if counter is None else None
        if not protocol.is_whole_number(number, minimum=1):
            raise ValueError(f"{writer / TASK_COUNTER} is not a task counter: a person has to look")
        while os.path.lexists(run_dir / "tasks" / f"TASK-{number:06d}.md"):
            number += 1
        write_durable(writer / TASK_COUNTER, json_file({"next": number + 1}), root=run_dir)
    return f"TASK-{number:06d}"


def _submission_event(
    run_dir: Path, result: TaskResult, client_submission_id: str | None, digest: str, **extra: Any
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "request_digest": digest,
        "digest_schema_version": DIGEST_SCHEMA,
        "disposition": result.disposition,
        "action_taken": result.action_taken,
        "task_id": result.task_id,
        "legacy": result.legacy,
    }
    if client_submission_id is not None:
        fields["client_submission_id"] = client_submission_id
    if result.reason is not None:
        fields["reason"] = result.reason
    fields.update(extra)
    return append_event(run_dir, "submission", fields)


def write_task(run_dir: Path, request: Mapping[str, Any], client_submission_id: str | None = None) -> TaskResult:
    """Create a task at most once per ``client_submission_id``.

    The three-phase contract of RUN_DIRECTORY.md: reserved -> task_created ->
    committed, each persisted before the next step, under a per-submission
    lock. Returns the disposition (created, reused, conflict); one
    ``submission`` event is appended per call. The run's state must allow
    work (as for tool calls: ``ValueError`` otherwise). When the task exists
    but what records it cannot be written, ``RecordingIncomplete`` says so.
    """
    run_dir = Path(run_dir)
    if not isinstance(request, Mapping):
        raise ValueError("request must be a JSON object")
    next_attempt(run_dir)  # the same gate as a tool call: a finished run creates nothing
    key_for_run(run_dir)  # and a signed run only with its key, before the task exists
    digest = protocol.request_digest(request)
    if client_submission_id is None:
        return _write_legacy_task(run_dir, request, digest)
    if (
        not isinstance(client_submission_id, str)
        or not 1 <= len(client_submission_id) <= protocol.MAX_SUBMISSION_ID_LENGTH
    ):
        raise ValueError("client_submission_id must be a string of 1 to 256 characters")
    key = protocol.submission_key(client_submission_id)
    record_path = run_dir / "submissions" / f"{key}.json"
    # The event is appended under the submission's lock, so that the record can
    # say which event recorded its creation (see _record_creation_event).
    with exclusive_lock(run_dir / WRITER_DIR / f"submission-{key}.lock", root=run_dir):
        result = _write_task_locked(run_dir, request, client_submission_id, record_path, digest)
        if result.disposition == "conflict":
            _submission_event(run_dir, result, client_submission_id, digest)
            return result
        # The task exists: from here a failure is a record left incomplete, never "nothing happened".
        with recording(result):
            if result.disposition == "reused":
                _recover_creation_event(run_dir, record_path, client_submission_id)
            event = _submission_event(run_dir, result, client_submission_id, digest)
            if result.disposition == "created":
                _note_creation_event(run_dir, record_path, event["seq"])
    return result


def _note_creation_event(run_dir: Path, record_path: Path, seq: int) -> None:
    record = read_json_file(record_path, run_dir)
    record["created_event_seq"] = seq
    write_durable(record_path, json_file(record), root=run_dir)


def _recover_creation_event(run_dir: Path, record_path: Path, client_submission_id: str) -> None:
    """Append the ``created`` event a crash kept out of the ledger, marked as recovered.

    The process that created the task may die between committing the record
    and appending its event; the history would then start with ``reused``. A
    committed record without ``created_event_seq`` is that case (or a record
    from before the field): the ledger is searched once, and the event is
    appended only when no ``created`` event for this submission is there.
    """
    record = read_json_file(record_path, run_dir)
    if "created_event_seq" in record:
        return
    seq = next(
        (
            event.get("seq")
            for event in read_events(run_dir)
            if event.get("type") == "submission"
            and event.get("client_submission_id") == client_submission_id
            and event.get("disposition") == "created"
        ),
        None,
    )
    if seq is None:
        first = record["creation_result"]
        created = TaskResult("created", True, first.get("task_id"), first.get("task_path"))
        event = _submission_event(
            run_dir,
            created,
            client_submission_id,
            record["request_digest"],
            recovered=True,
            created_at=first.get("created_at"),
        )
        seq = event["seq"]
    record["created_event_seq"] = seq
    write_durable(record_path, json_file(record), root=run_dir)


def _write_legacy_task(run_dir: Path, request: Mapping[str, Any], digest: str) -> TaskResult:
    # No submission id: a new task every call, and no idempotency claimed.
    task_id = _allocate_task_id(run_dir)
    task_path = f"tasks/{task_id}.md"
    create_durable(run_dir / task_path, protocol.render_task(task_id, request, None), root=run_dir)
    result = TaskResult("created", True, task_id, task_path, legacy=True)
    with recording(result):
        _submission_event(run_dir, result, None, digest)
    return result


def _record_problem(record: Any) -> str | None:
    """Why a submission record has a shape the writer cannot act on, or ``None``."""
    if not isinstance(record, dict) or record.get("state") not in protocol.SUBMISSION_STATES:
        return "no known state"
    for name in ("client_submission_id", "request_digest", "digest_schema_version", "task_id", "task_path"):
        if not isinstance(record.get(name), str):
            return f"{name} is not a string"
    if not isinstance(record.get("request"), dict):
        return "request is not an object"
    if record["state"] != "reserved" and not isinstance(record.get("task_sha256"), str):
        return "task_sha256 is not a string"
    if record["state"] == "committed" and not isinstance(record.get("creation_result"), dict):
        return "creation_result is not an object"
    return None


def _write_task_locked(
    run_dir: Path, request: Mapping[str, Any], client_submission_id: str, record_path: Path, digest: str
) -> TaskResult:
    try:
        record = read_json_file(record_path, run_dir)
    except UnsafePath:
        raise  # a symlink is not a record: refused, never read through
    except ValueError:
        # Never overwrite a record we cannot read: a person has to look.
        return TaskResult("conflict", False, None, None, reason="record_unreadable")
    now = format_time(utc_now())

    if record is None:
        task_id = _allocate_task_id(run_dir)
        record = {
            "client_submission_id": client_submission_id,
            "digest_schema_version": DIGEST_SCHEMA,
            "request_digest": digest,
            "request": protocol.semantic_request(request),
            "state": "reserved",
            "task_id": task_id,
            "task_path": f"tasks/{task_id}.md",
            "reserved_at": now,
            "updated_at": now,
        }
        write_durable(record_path, json_file(record), root=run_dir)
        failpoint("after_reserve")

    if _record_problem(record) is not None or record["client_submission_id"] != client_submission_id:
        return TaskResult("conflict", False, None, None, reason="record_invalid")
    task_id, task_path = record["task_id"], record["task_path"]
    if record["digest_schema_version"] != DIGEST_SCHEMA:
        return TaskResult("conflict", False, task_id, task_path, reason="digest_schema_version_differs")
    if record["request_digest"] != digest:
        return TaskResult("conflict", False, task_id, task_path, reason="request_digest_differs")
    if record["state"] == "committed":
        first = record["creation_result"]
        return TaskResult("reused", False, first.get("task_id", task_id), first.get("task_path", task_path))
    if not protocol.safe_task_path(task_path):
        return TaskResult("conflict", False, task_id, task_path, reason="record_invalid")
    task_file = run_dir / task_path

    created = TaskResult("created", True, task_id, task_path)
    if record["state"] == "reserved":
        content = protocol.render_task(task_id, record["request"], client_submission_id)
        remove_old_temp_files(task_file, run_dir)  # a kill between a temp task file and its link left these
        try:
            create_durable(task_file, content, root=run_dir)
        except FileExistsError:
            if read_file(task_file, run_dir) != content:
                return TaskResult("conflict", False, task_id, task_path, reason="task_file_differs")
            # Our own file from a call that died after creating it: adopt it.
        failpoint("after_task_file")
        record.update(state="task_created", task_sha256=sha256_hex(content), updated_at=format_time(utc_now()))
        with recording(created):
            write_durable(record_path, json_file(record), root=run_dir)
        failpoint("after_task_created")

    try:
        present = read_file(task_file, run_dir)
    except FileNotFoundError:
        return TaskResult("conflict", False, task_id, task_path, reason="task_missing")
    if sha256_hex(present) != record.get("task_sha256"):
        return TaskResult("conflict", False, task_id, task_path, reason="task_digest_mismatch")
    now = format_time(utc_now())
    record.update(
        state="committed",
        updated_at=now,
        creation_result={
            "task_id": task_id,
            "task_path": task_path,
            "task_sha256": record["task_sha256"],
            "created_at": now,
        },
    )
    with recording(created):
        write_durable(record_path, json_file(record), root=run_dir)
    failpoint("after_commit")
    return created
