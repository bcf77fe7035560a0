"""A person's decision about a call in doubt: ``confirm_call`` writes it, under the call's lock,
for the runtime to follow; ``call_in_doubt`` says whether a call may be settled at all.

The dashboard's settle, a host's delivery, the shipper, the writer daemon and the ``confirm``
command all come here. A decision holds to the receipt bytes the person saw: a receipt changed
since, a call no longer in doubt, or another decision on record is ``ConfirmationRefused``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.builtin_tools import BUILTIN_ADAPTERS
from receipts.confined import read_file
from receipts.durable import append_event, exclusive_lock, failpoint, json_file, remove_file, write_durable
from receipts.outcomes import ConfirmationRefused
from receipts.protocol import WRITER_DIR, SigningKey, format_time, sha256_hex, utc_now
from receipts.recovery import decide
from receipts.runs import run_contract
from receipts.runtime.call_records import (
    commit_problem,
    confirmation_event,
    file_size,
    read_confirmation,
    read_note,
    recover_lost_confirmation_event,
    write_note,
)
from receipts.runtime.served import daemon_socket
from receipts.signing import key_for_run


def refusal_text(refused: ConfirmationRefused) -> str:
    """Why a decision was not written, as the dashboard says it (the host's delivery and the
    shipper's say the same)."""
    if refused.current_receipt_sha256:
        return (
            "the receipt changed after the decision was made (the runtime moved on): the decision holds to "
            f"bytes that are no longer there (now {refused.current_receipt_sha256[:12]}…)"
        )
    if refused.existing is not None:
        other = refused.existing
        return (
            f"the run directory already holds another decision: {other.get('actor')} settled it as "
            f"{other.get('resolution')} at {protocol.human_time(other.get('confirmed_at'))}"
        )
    return str(refused)


def confirm_call(
    run_dir: Path,
    call_id: str,
    *,
    resolution: str,
    reason: str,
    actor: str,
    receipt_sha256: str,
    confirmed_at: str | None = None,
    writer_socket: str | None = None,
) -> tuple[dict[str, Any], bool]:
    """Write a person's decision about a call in doubt, for the runtime to follow.

    Under the call's lock (so a resuming runtime and a person never cross): the
    receipt must still be the bytes the person saw (``receipt_sha256``), and the
    call must still be in doubt (prepared, unknown, or a receipt that fails its
    identity check). ``confirmations/<call_id>.json`` is written durably and a
    ``confirmation`` event appended; if the event cannot be appended the file is
    removed again, so either both exist or neither. Returns the confirmation and
    whether it was written now (``False``: the same decision was already there,
    recorded once). Raises ``ConfirmationRefused`` otherwise.
    """
    run_dir = Path(run_dir)
    served_by = daemon_socket(writer_socket)
    if served_by:
        from receipts import client

        answer = client.request(served_by, "confirm", run_dir, call_id=call_id, resolution=resolution, reason=reason,
                                actor=actor, receipt_sha256=receipt_sha256, confirmed_at=confirmed_at)  # fmt: skip
        return answer["document"], bool(answer["written"])
    if resolution not in protocol.RESOLUTIONS:
        raise ConfirmationRefused(f"resolution must be one of {', '.join(protocol.RESOLUTIONS)}")
    if not isinstance(reason, str) or not reason.strip():
        raise ConfirmationRefused("a reason is required")
    if not protocol.valid_call_name(call_id) or not isinstance(actor, str) or not actor.strip():
        raise ConfirmationRefused("a call_id and an actor are required")
    signing_key = key_for_run(run_dir)  # in a signed run, only a signed decision holds
    with exclusive_lock(run_dir / WRITER_DIR / f"call-{call_id}.lock", root=run_dir) as lock_fd:
        recover_lost_confirmation_event(run_dir, call_id, lock_fd, signing_key)
        receipt_path = run_dir / "receipts" / f"{call_id}.json"
        try:
            receipt_bytes = read_file(receipt_path, run_dir)
        except FileNotFoundError:
            raise ConfirmationRefused("there is no receipt for this call_id") from None
        current = sha256_hex(receipt_bytes)
        if current != receipt_sha256:
            raise ConfirmationRefused("the receipt changed since it was shown", current_receipt_sha256=current)
        if not call_in_doubt(run_dir, call_id, receipt_bytes, signing_key=signing_key):
            raise ConfirmationRefused("the call is not in doubt: its verified receipt says what happened")
        wanted = protocol.confirmation_id(call_id, resolution, receipt_sha256)
        existing = read_confirmation(run_dir, call_id, receipt_bytes, signing_key)
        if existing is not None:
            if existing["confirmation_id"] == wanted:
                return existing, False
            raise ConfirmationRefused("another decision about this call is already on record", existing=existing)
        document = {
            "schema": protocol.CONFIRMATION_SCHEMA,
            "call_id": call_id,
            "resolution": resolution,
            "reason": reason.strip(),
            "actor": actor,
            "confirmed_at": confirmed_at or format_time(utc_now()),
            "receipt_sha256": receipt_sha256,
            "confirmation_id": wanted,
        }
        path = run_dir / "confirmations" / f"{call_id}.json"
        # As a receipt's: a note first, so that a kill between the file and its event is repaired
        # by the next writer under this lock (``recover_lost_confirmation_event``).
        before = read_note(lock_fd)
        installed = before.get("installed", False)
        pending = {"confirmation": wanted, "ledger_size": file_size(run_dir / protocol.LEDGER_NAME)}
        write_note(lock_fd, {"installed": installed} | pending)
        write_durable(path, json_file(protocol.signed(document, signing_key)), root=run_dir)
        failpoint("after_confirmation_file")
        try:
            append_event(run_dir, "confirmation", confirmation_event(document))
        except (OSError, ValueError):  # a full disk, or a ledger that is a symlink (UnsafePath)
            remove_file(path, run_dir)
            write_note(lock_fd, before)
            raise
        write_note(lock_fd, {"installed": installed}, durable=False)
        return document, True


def call_in_doubt(
    run_dir: Path,
    call_id: str,
    receipt_bytes: bytes,
    adapters: Mapping[str, Any] = BUILTIN_ADAPTERS,
    signing_key: SigningKey | None = None,
) -> bool:
    """Whether a person may settle the call: its recovery decision, made from its receipt (and,
    for a commit, its target) with no confirmation, waits for someone (``protocol.in_doubt``).

    Prepared, unknown, a receipt that does not prove it is this call, a commit its target does
    not show (the writer would not reuse it), a legacy "failed": yes. Rejected or a proven
    commit: no.
    """
    try:
        receipt = protocol.load_json_strict(receipt_bytes)
    except ValueError:
        return True
    if not isinstance(receipt, dict):
        return True
    contract = run_contract(run_dir)
    check = protocol.check_receipt_identity(receipt, call_id=call_id, contract_sha256=contract, signing_key=signing_key)
    status = receipt.get("status") if isinstance(receipt.get("status"), str) else ""
    verification = check.verdict
    if check.verified and status == "committed":
        tool = receipt.get("tool")
        adapter = adapters.get(tool) if isinstance(tool, str) else None
        if commit_problem(run_dir, adapter, receipt) is not None:
            verification = protocol.DISPUTED
    return protocol.in_doubt(decide(status=status, verification=verification).decision)
