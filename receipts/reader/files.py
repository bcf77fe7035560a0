"""Everything in a run directory but the ledger: state, steer, receipts, confirmations.

Each file is checked against the spec's finding table and against the call
ids the ledger names; submissions and their tasks are ``submissions``' part.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.findings import storable_text
from receipts.protocol import RUN_FOLDERS
from receipts.reader.checks import RunContext
from receipts.reader.ledger import LedgerCursor
from receipts.reader.records import CallRecord, ConfirmationRecord, RunFiles, text, time_field
from receipts.reader.safe_open import DEFAULT_LIMITS, Limits, Unsafe, _exists, open_dir, read_regular, signature_of
from receipts.reader.submissions import read_submissions


class _RunReader(RunContext):
    """The files of a run, read once each: state, steer, receipts, confirmations, submissions."""

    def read(self) -> RunFiles:
        try:
            run_fd = open_dir(self.run_dir)
        except (Unsafe, OSError) as error:
            self.finding("unsafe_path", str(self.run_dir), str(error))
            return self.out
        folders: dict[str, int | None] = {}
        try:
            self.read_state(run_fd)
            self.read_steer(run_fd)
            if self.out.contract_sha256 != self.known_contract:
                self.known = {}  # every identity check depends on the contract: check them all again
            for name in RUN_FOLDERS:
                folders[name] = self.folder(run_fd, name)
            self.read_receipts(folders["receipts"])
            confirmations = self.read_confirmations(folders["confirmations"])
            read_submissions(self, folders["submissions"], folders["tasks"])
            self.cross_check(confirmations)
        finally:
            for fd in folders.values():
                if fd is not None:
                    os.close(fd)
            os.close(run_fd)
        return self.out

    def read_state(self, run_fd: int) -> None:
        parsed = self.read_json("state.json", run_fd, "state.json")
        if parsed is None:
            return
        state, _ = parsed
        name, attempts = (state.get("name"), state.get("attempts")) if isinstance(state, dict) else (None, None)
        if not protocol.is_whole_number(attempts):
            attempts = None
        if not isinstance(name, str) or attempts is None:
            self.finding("schema_error", "state.json", f"needs a string name and attempts from 0 to {protocol.MAX_INT}")
        name = name[:64] if isinstance(name, str) else ""
        if "\x00" in name:
            self.finding("unstorable_value", "state.json", "U+0000 in name: stored with U+FFFD in its place")
        self.out.state = storable_text(name)
        self.out.attempts = attempts

    def read_steer(self, run_fd: int) -> None:
        if not _exists(run_fd, "steer.json"):
            self.finding("schema_error", "steer.json", "missing: receipts' contract cannot be checked")
            return
        parsed = self.read_json("steer.json", run_fd, "steer.json")
        if parsed is None:
            return
        steer, _ = parsed
        contract = steer.get("contract_sha256") if isinstance(steer, dict) else None
        if isinstance(steer, dict):
            self.check_signed_run(steer)
        if not isinstance(contract, str) or not protocol.HEX64_RE.fullmatch(contract):
            self.finding("schema_error", "steer.json", "contract_sha256 must be 64 lowercase hex digits")
            return
        self.out.contract_sha256 = contract

    def check_signed_run(self, steer: dict[str, Any]) -> None:
        """Whose key signs this run, and whether steer.json itself verifies with it."""
        if not self.keys:
            return  # without keys, nothing about signatures is said
        self.signing_key = signing_key_of(steer, self.keys, self.run_dir.name)
        key_id = steer.get("signing_key_id")
        if key_id is None:
            if self.require_signed:
                self.finding("signature_missing", "steer.json", "an unsigned run, where only signed runs are accepted")
        elif self.signing_key is None:
            self.finding(
                "signature_unchecked",
                "steer.json",
                f"signed with key {str(key_id)[:40]!r}, which this reader does not have: no signature was checked",
            )
        elif (wrong := protocol.signature_problem(steer, self.signing_key)) is not None:
            self.finding(wrong[0], "steer.json", wrong[1])

    def read_receipts(self, dir_fd: int | None) -> None:
        if dir_fd is None:
            return
        for name in self.json_names(dir_fd, "receipts"):
            subject = f"receipts/{name}"
            stem = name[: -len(".json")]
            if len(stem) > protocol.MAX_CALL_ID_LENGTH:
                self.finding(
                    "unsafe_path", subject, f"file name over {protocol.MAX_CALL_ID_LENGTH} characters: not read"
                )
                continue
            self.receipt_files.add(stem)
            signature = self.listed_signatures.get(name) or signature_of(name, dir_fd)
            known = self.known.get(stem)
            if known is not None and signature and signature == known.file_signature:
                self.receipt_shas[stem] = known.file_sha256
                self.out.calls.append(known)
                self.out.reused_calls.add(stem)
                continue
            parsed = self.read_json(name, dir_fd, subject)
            if parsed is None:
                continue
            receipt, file_sha = parsed
            self.receipt_shas[stem] = file_sha
            call = self.receipt_record(receipt, stem, file_sha, subject)
            if call is not None:
                call.file_signature = signature
                self.out.calls.append(call)

    def receipt_record(self, receipt: Any, stem: str, file_sha: str, subject: str) -> CallRecord | None:
        if not isinstance(receipt, dict):
            self.finding("schema_error", subject, "a receipt must be a JSON object")
            return None
        missing = [
            name
            for name, kind in (("call_id", str), ("status", str), ("tool", str), ("args", dict))
            if not isinstance(receipt.get(name), kind)
        ]
        if missing:
            self.finding("schema_error", subject, f"missing or wrong type: {', '.join(missing)}", call_id=stem)
            return None
        call = CallRecord(
            call_id=stem,
            file_sha256=file_sha,
            declared_call_id=receipt["call_id"],
            status=receipt["status"][:32],
            tool=receipt["tool"],
            args=receipt["args"],
        )
        self.optional_receipt_fields(receipt, call, subject)
        call.recomputed_input_sha256 = protocol.input_sha256(call.args)
        self.check_identity(receipt, call, subject)
        self.check_status(call, subject)
        self.storable(call, subject)
        return call

    def optional_receipt_fields(self, receipt: dict[str, Any], call: CallRecord, subject: str) -> None:
        wrong = []
        for name in ("identity", "contract_sha256", "tool_version", "input_sha256", "output_sha256"):
            value = receipt.get(name)
            if value is not None and not isinstance(value, str):
                wrong.append(name)
            else:
                setattr(call, name, value or "")
        attempt = receipt.get("attempt")
        if attempt is not None and not protocol.is_whole_number(attempt):
            wrong.append(f"attempt (a whole number from 0 to {protocol.MAX_INT})")
        elif attempt is not None:
            call.attempt = attempt
        for name in ("result", "error"):
            value = receipt.get(name)
            if value is not None and not isinstance(value, dict):
                wrong.append(name)
            else:
                setattr(call, name, value)
        if isinstance(call.error, dict):
            call.error_kind = text(call.error.get("kind"))[:32]
        queryable = receipt.get("queryable", False)
        if not isinstance(queryable, bool):
            wrong.append("queryable")
        else:
            call.queryable = queryable
        for name in ("created_at", "updated_at"):
            value = time_field(receipt, name)
            if value is None and receipt.get(name) is not None:
                wrong.append(name)
            setattr(call, name, value)
        if wrong:
            self.finding("schema_error", subject, f"wrong type: {', '.join(wrong)}", call_id=call.call_id)

    def check_identity(self, receipt: dict[str, Any], call: CallRecord, subject: str) -> None:
        """The protocol's one identity check; each problem it names is a finding."""
        check = protocol.check_receipt_identity(
            receipt,
            call_id=call.call_id,
            contract_sha256=self.out.contract_sha256 or None,
            signing_key=self.signing_key,
        )
        call.verification = check.verdict
        call.recomputed_call_id = check.recomputed_call_id
        for code, detail, stored, recomputed in check.problems:
            self.mismatch(code, subject, detail, stored, recomputed, call_id=call.call_id)

    def check_status(self, call: CallRecord, subject: str) -> None:
        if call.status == protocol.LEGACY_STATUS:
            self.finding(
                "legacy_status", subject, "status 'failed' cannot tell retryable from permanent", call_id=call.call_id
            )
        elif call.status not in protocol.RECEIPT_STATUSES:
            self.finding("invalid_status", subject, f"status {call.status!r}", call_id=call.call_id)

    def read_confirmations(self, dir_fd: int | None) -> dict[str, ConfirmationRecord]:
        found: dict[str, ConfirmationRecord] = {}
        if dir_fd is None:
            return found
        for name in self.json_names(dir_fd, "confirmations"):
            subject = f"confirmations/{name}"
            stem = name[: -len(".json")]
            if len(stem) > protocol.MAX_CALL_ID_LENGTH:
                self.finding("unsafe_path", subject, f"file name over {protocol.MAX_CALL_ID_LENGTH} characters")
                continue
            parsed = self.read_json(name, dir_fd, subject)
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
            problem = protocol.confirmation_problem(document, stem, self.receipt_shas.get(stem), self.signing_key)
            record.valid = problem is None
            record.problem = problem or ""
            if problem is not None:
                stored, recomputed = record.receipt_sha256, self.receipt_shas.get(stem, "")
                self.mismatch("confirmation_invalid", subject, problem, stored, recomputed, call_id=stem)
            self.storable(record, subject)
            found[stem] = record
            self.out.confirmations.append(record)
        return found

    def cross_check(self, confirmations: dict[str, ConfirmationRecord]) -> None:
        self.check_against_the_ledger()
        by_id = {call.call_id: call for call in self.out.calls}
        for call_id in sorted(self.ledger_call_ids - self.receipt_files):
            self.finding(
                "missing_receipt", call_id, "the ledger names this call but there is no receipt file", call_id=call_id
            )
            by_id[call_id] = CallRecord(call_id=call_id, receipt_present=False)
            self.out.calls.append(by_id[call_id])
        for call in self.out.calls:
            if call.receipt_present and call.call_id not in self.ledger_call_ids:
                self.finding(
                    "orphan_receipt",
                    f"receipts/{call.call_id}.json",
                    "no ledger event names this call",
                    call_id=call.call_id,
                )
            confirmation = confirmations.get(call.call_id)
            if call.status in protocol.OPEN_STATUSES and not (confirmation is not None and confirmation.valid):
                self.check_stale_call(call)

    def check_against_the_ledger(self) -> None:
        """What the receipts say against what the ledger recorded of them.

        A committed receipt without a committed event: a kill between the rename
        and the event (the writer appends it, ``recovered``, at the next touch), or
        a status edited afterwards. A committed receipt whose last reuse the writer
        refused (``reuse_refused``: its target did not show the result) is
        ``disputed``: it proves nothing until a person settles it. Receipts not
        read again get the same verdict from the ledger as it stands now.
        """
        for call in self.out.calls:
            subject = f"receipts/{call.call_id}.json"
            if call.verification == protocol.DISPUTED:
                call.verification = protocol.VERIFIED  # judged again from the ledger below
            if call.status != "committed":
                continue
            if call.call_id not in self.ledger.committed_call_ids:
                self.finding(
                    "committed_event_missing",
                    subject,
                    "committed, but no ledger event records the commit (lost to a kill, or the status was edited)",
                    call_id=call.call_id,
                )
            if call.verification == protocol.VERIFIED and call.call_id in self.ledger.disputed_call_ids:
                call.verification = protocol.DISPUTED
                self.finding(
                    "effect_not_shown",
                    subject,
                    "the writer refused to reuse this commit: its target did not show the result (see the ledger's "
                    "reuse_refused event); a person decides",
                    call_id=call.call_id,
                )

    def check_stale_call(self, call: CallRecord) -> None:
        since = call.updated_at or call.created_at
        if not self.past_stale_age(since):
            return
        self.finding(
            "stale_call",
            f"receipts/{call.call_id}.json",
            f"{call.status} since {protocol.format_time(since)}, unconfirmed",
            call_id=call.call_id,
        )


def read_run_files(
    run_dir: Path,
    *,
    ledger: LedgerCursor,
    limits: Limits = DEFAULT_LIMITS,
    now: dt.datetime | None = None,
    known_receipts: dict[str, CallRecord] | None = None,
    known_contract: str = "",
    listed_signatures: dict[str, str] | None = None,
    keys: Mapping[str, protocol.SigningKey] | None = None,
    require_signed: bool = False,
) -> RunFiles:
    """Everything in a run directory but the ledger, checked against what the ledger says
    (``ledger``: the cursor after the whole ledger was read: the calls it names, commits, disputes).

    ``known_receipts``: records of receipts read before (with their ``file_signature``),
    made under ``known_contract``. A receipt whose signature has not changed is not read
    again: its known record is used (and named in ``reused_calls``). Only records whose
    file raised no finding of its own should be passed, since a reused file reports none.
    ``listed_signatures``: the receipts' signatures as ``run_fingerprint`` just took them
    (a file that changes after it is cannot be reused past the next import's fingerprint).
    """
    reader = _RunReader(Path(run_dir), ledger, limits, now or protocol.utc_now())
    reader.known, reader.known_contract = dict(known_receipts or {}), known_contract
    reader.listed_signatures = listed_signatures or {}
    reader.keys, reader.require_signed = keys or {}, require_signed
    return reader.read()


def signing_key_of(steer: Any, keys: Mapping[str, protocol.SigningKey], run_id: str) -> protocol.SigningKey | None:
    """The key among ``keys`` whose id steer.json names (a signed run), bound to the run, or ``None``."""
    key_id = steer.get("signing_key_id") if isinstance(steer, dict) else None
    key = keys.get(key_id) if isinstance(key_id, str) else None
    return None if key is None else key.for_run(run_id)


def run_signing_key(run_dir: Path, keys: Mapping[str, protocol.SigningKey] | None) -> protocol.SigningKey | None:
    """A signed run's key, read from its steer.json before its ledger is (no symlink followed)."""
    if not keys:
        return None
    try:
        fd = open_dir(run_dir)
    except (Unsafe, OSError):
        return None
    try:
        steer = protocol.load_json_strict(read_regular("steer.json", fd, DEFAULT_LIMITS.max_json_bytes))
    except (Unsafe, OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return signing_key_of(steer, keys, Path(run_dir).name)
