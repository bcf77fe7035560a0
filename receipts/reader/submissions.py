"""Submission records and the task files they describe (the checks of task creation).

Functions of the run's ``RunContext``: what they find goes to its findings, what they
keep to its ``out.submissions``.
"""

from __future__ import annotations

import hashlib
from typing import Any

from receipts import protocol
from receipts.confined import UnsafePath
from receipts.findings import Sentence
from receipts.reader.checks import RunContext
from receipts.reader.records import SubmissionRecord, copy_fields, time_field
from receipts.reader.safe_open import read_regular


def read_submissions(run: RunContext, dir_fd: int | None, tasks_fd: int | None) -> None:
    """The submission records of a run (``submissions/``) and the task files they describe (``tasks/``)."""
    if dir_fd is None:
        return
    seen: set[str] = set()
    for name in run.json_names(dir_fd, "submissions"):
        subject = f"submissions/{name}"
        parsed = run.read_json(name, dir_fd, subject)
        if parsed is None:
            continue
        record, file_sha = parsed
        submission = _submission_record(run, record, name, file_sha, subject)
        if submission is None:
            continue
        _check_task(run, submission, tasks_fd, subject)
        run.storable(submission, subject)
        # Two ids that differ only where U+0000 stood are one row: the first stays, the other is named.
        if submission.client_submission_id in seen:
            run.finding("unstorable_value", subject, Sentence("unstorable_value.submission_id"))
            continue
        seen.add(submission.client_submission_id)
        run.out.submissions.append(submission)


def _submission_record(run: RunContext, record: Any, name: str, file_sha: str, subject: str) -> SubmissionRecord | None:
    if not isinstance(record, dict):
        run.finding("schema_error", subject, Sentence("schema_error.submission_not_object"))
        return None
    submission_id = record.get("client_submission_id")
    if not isinstance(submission_id, str) or not 1 <= len(submission_id) <= protocol.MAX_SUBMISSION_ID_LENGTH:
        run.finding("schema_error", subject, Sentence("schema_error.submission_id"))
        return None
    key = protocol.submission_key(submission_id)
    if name != f"{key}.json":
        run.finding("schema_error", subject, Sentence("schema_error.submission_name"))
        return None
    submission = SubmissionRecord(client_submission_id=submission_id, record_key=key, file_sha256=file_sha)
    texts = ("digest_schema_version", "request_digest", "state", "task_id", "task_path", "task_sha256")
    wrong = copy_fields(record, submission, texts, str, "")
    submission.state = submission.state[:32]
    request = record.get("request")
    if not isinstance(request, dict):
        wrong.append("request")
    else:
        submission.request = request
    wrong += copy_fields(record, submission, ("creation_result",), dict, None)
    submission.reserved_at = time_field(record, "reserved_at")
    submission.updated_at = time_field(record, "updated_at")
    if submission.state and submission.state not in protocol.SUBMISSION_STATES:
        wrong.append(f"state {submission.state!r}")
    if wrong:
        run.finding("schema_error", subject, Sentence("schema_error.missing_or_wrong_type", fields=", ".join(wrong)))
    if isinstance(request, dict) and submission.digest_schema_version == protocol.DIGEST_SCHEMA:
        try:
            submission.recomputed_digest = protocol.request_digest(request)
        except ValueError as error:  # keys that collide once normalised: no digest is the request's
            run.finding("schema_error", subject, Sentence("schema_error.request_digest", error=error))
            return submission
        if submission.recomputed_digest != submission.request_digest:
            run.mismatch(
                "submission_digest_mismatch",
                subject,
                Sentence("submission_digest_mismatch.request"),
                submission.request_digest,
                submission.recomputed_digest,
                record_key=submission.record_key,
            )
    return submission


def _check_task(run: RunContext, submission: SubmissionRecord, tasks_fd: int | None, subject: str) -> None:
    path = submission.task_path
    if not path:
        return
    if not protocol.safe_task_path(path):
        run.finding("unsafe_path", subject, Sentence("unsafe_path.task_path", path=repr(path[:200]), folder="tasks/"))
        return
    name = path.removeprefix("tasks/")
    data = None
    if tasks_fd is not None:
        try:
            data = read_regular(name, tasks_fd, run.limits.max_json_bytes)
        except FileNotFoundError:
            data = None
        except UnsafePath as unsafe:
            run.finding(unsafe.code, path, unsafe.detail)
            return
    submission.task_present = data is not None
    if data is not None:
        submission.task_file_sha256 = hashlib.sha256(data).hexdigest()
        expected = submission.task_sha256
        if submission.state == "reserved" and isinstance(submission.request, dict):
            # No digest recorded yet: the writer would adopt only the file it renders itrun.
            try:
                rendered = protocol.render_task(submission.task_id, submission.request, submission.client_submission_id)
                expected = hashlib.sha256(rendered).hexdigest()
            except ValueError:  # a request the writer refuses renders no file, so none is its own
                expected = ""
        submission.task_matches = submission.task_file_sha256 == expected
    if submission.state in ("task_created", "committed"):
        if data is None:
            run.finding(
                "task_missing",
                subject,
                Sentence("task_missing.absent", path=path, state=submission.state),
                record_key=submission.record_key,
            )
        elif submission.task_file_sha256 != submission.task_sha256:
            run.mismatch(
                "task_digest_mismatch",
                subject,
                Sentence("task_digest_mismatch.file", path=path),
                submission.task_sha256,
                submission.task_file_sha256,
                record_key=submission.record_key,
            )
    if submission.state in ("reserved", "task_created"):
        _check_stale_reservation(run, submission, subject)


def _check_stale_reservation(run: RunContext, submission: SubmissionRecord, subject: str) -> None:
    since = submission.updated_at or submission.reserved_at
    if not run.past_stale_age(since):
        return
    which = ("matching" if submission.task_matches else "differing") if submission.task_present else "absent"
    run.finding(
        "stale_reservation",
        subject,
        Sentence(
            f"stale_reservation.{which}",
            state=submission.state,
            since=protocol.human_time(since),
            task_id=submission.task_id,
        ),
        record_key=submission.record_key,
    )
