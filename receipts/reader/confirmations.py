"""The confirmations of a run (``confirmations/``): a person's resolution of a call, checked
against the receipt it names."""

from __future__ import annotations

from collections.abc import Mapping

from receipts import protocol
from receipts.findings import Sentence
from receipts.reader.checks import RunContext
from receipts.reader.records import ConfirmationRecord, text, time_field


def read_confirmations(
    run: RunContext,
    dir_fd: int | None,
    receipt_shas: Mapping[str, str],
    signing_key: protocol.SigningKey | None,
) -> dict[str, ConfirmationRecord]:
    """The confirmations of ``confirmations/`` (``dir_fd``) by call id, each checked against the digest
    of the receipt it confirms (``receipt_shas``) and, in a signed run, against ``signing_key``."""
    found: dict[str, ConfirmationRecord] = {}
    if dir_fd is None:
        return found
    too_long = Sentence("unsafe_path.confirmation_name_too_long", limit=protocol.MAX_CALL_ID_LENGTH)
    for name, stem, subject in run.call_files(dir_fd, "confirmations", too_long):
        parsed = run.read_json(name, dir_fd, subject)
        if parsed is None:
            continue
        document, file_sha = parsed
        record = ConfirmationRecord(call_id=stem, file_sha256=file_sha)
        if isinstance(document, dict):
            record.resolution = text(document.get("resolution"))
            record.reason = text(document.get("reason"))
            record.actor = text(document.get("actor"))
            record.confirmed_at = time_field(document, "confirmed_at")
            record.receipt_sha256 = text(document.get("receipt_sha256"))
            record.confirmation_id = text(document.get("confirmation_id"))
        problem = protocol.confirmation_problem(document, stem, receipt_shas.get(stem), signing_key)
        record.valid = problem is None
        record.problem = problem or ""
        if problem is not None:
            stored, recomputed = record.receipt_sha256, receipt_shas.get(stem, "")
            run.mismatch("confirmation_invalid", subject, problem, stored, recomputed, call_id=stem)
        run.storable(record, subject)
        found[stem] = record
        run.out.confirmations.append(record)
    return found
