"""What the reader returns for the files of a run: one record per receipt, submission and confirmation."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from receipts import protocol
from receipts.findings import FindingRecord

# --- everything but the ledger --------------------------------------------


@dataclasses.dataclass
class CallRecord:
    call_id: str
    receipt_present: bool = True
    file_sha256: str = ""
    declared_call_id: str = ""
    status: str = ""
    tool: str = ""
    tool_version: str = ""
    identity: str = ""
    contract_sha256: str = ""
    attempt: int | None = None
    args: Any = None
    input_sha256: str = ""
    recomputed_input_sha256: str = ""
    output_sha256: str = ""
    result: Any = None
    error: Any = None
    error_kind: str = ""
    queryable: bool = False
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    recomputed_call_id: str = ""
    verification: str = ""
    decision: str = ""
    decision_reason: str = ""
    # The file's size, mtime, ctime and inode when it was read (safe_open.signature_of): the
    # next import reads it again only when these differ.
    file_signature: str = ""


@dataclasses.dataclass
class SubmissionRecord:
    client_submission_id: str
    record_key: str
    file_sha256: str
    digest_schema_version: str = ""
    request_digest: str = ""
    recomputed_digest: str = ""
    request: Any = None
    state: str = ""
    task_id: str = ""
    task_path: str = ""
    task_sha256: str = ""
    task_present: bool = False
    task_file_sha256: str = ""
    task_matches: bool = False  # the file is the one the record describes (or, reserved, would write)
    creation_result: Any = None
    reserved_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None


@dataclasses.dataclass
class ConfirmationRecord:
    call_id: str
    file_sha256: str
    resolution: str = ""
    reason: str = ""
    actor: str = ""
    confirmed_at: dt.datetime | None = None
    receipt_sha256: str = ""
    confirmation_id: str = ""
    valid: bool = False
    problem: str = ""


@dataclasses.dataclass
class RunFiles:
    run_id: str
    state: str = ""
    attempts: int | None = None
    contract_sha256: str = ""
    calls: list[CallRecord] = dataclasses.field(default_factory=list)
    submissions: list[SubmissionRecord] = dataclasses.field(default_factory=list)
    confirmations: list[ConfirmationRecord] = dataclasses.field(default_factory=list)
    findings: list[FindingRecord] = dataclasses.field(default_factory=list)
    next_stale_at: dt.datetime | None = None  # when a finding may appear with no file changing
    # Receipts not read again (their signature had not changed): their records are the ones
    # passed in as known, and carry no args, result or error.
    reused_calls: set[str] = dataclasses.field(default_factory=set)
    # Asked to read some receipts only, it found the contract changed: read it again whole.
    contract_changed: bool = False
    # Call ids whose receipt file is there but gave no record (too large, not JSON, not a
    # receipt): each has a finding; replay names them, since no decision can come from them.
    unreadable_receipts: dict[str, str] = dataclasses.field(default_factory=dict)  # call id -> finding code


def time_field(document: dict[str, Any], name: str) -> dt.datetime | None:
    value = document.get(name)
    if value is None:
        return None
    try:
        return protocol.parse_time(value)
    except (ValueError, TypeError):
        return None


def text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def copy_fields(document: dict[str, Any], record: Any, names: tuple[str, ...], kind: type, absent: Any) -> list[str]:
    """Copy each of ``names`` from ``document`` to ``record`` when it is a ``kind`` (``absent`` when
    the document has none); the names of the others, which leave the record's default in place."""
    wrong = []
    for name in names:
        value = document.get(name)
        if value is None:
            setattr(record, name, absent)
        elif isinstance(value, kind):
            setattr(record, name, value)
        else:
            wrong.append(name)
    return wrong
