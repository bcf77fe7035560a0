"""The receipts of a run (``receipts/``): one ``CallRecord`` a file, its identity and status checked.

A receipt read before whose file has not changed (the same signature) is not
read again: the record passed in as known is kept in its place. Given a ``Spill``, the
records go to it in batches as they are read, so that memory holds one batch.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

from receipts import protocol
from receipts.findings import Sentence
from receipts.reader.checks import RunContext
from receipts.reader.records import CallRecord, copy_fields, text, time_field
from receipts.reader.safe_open import signature_of
from receipts.reader.spill import Spill


class ReceiptReader:
    """The receipts of a run, read into ``run.out.calls``; what the rest of the reading needs of them.

    ``known``: records of receipts read before, by call id, made under the run's present
    contract; ``listed_signatures``: the receipts' signatures as the run's fingerprint took
    them; ``signing_key``: the run's key when it is signed and the reader has it.

    ``spill``: where the records go, ``batch`` files at a time, instead of staying in
    ``run.out.calls`` (``batches`` gives them back); ``confirmed``: the call ids whose digest
    a confirmation will ask for (``shas`` keeps only theirs), when not every one's.
    """

    def __init__(
        self,
        run: RunContext,
        *,
        known: Mapping[str, CallRecord],
        listed_signatures: Mapping[str, str],
        signing_key: protocol.SigningKey | None,
        spill: Spill | None = None,
        batch: int = 0,
        confirmed: Collection[str] | None = None,
    ) -> None:
        self.run = run
        self.known = known
        self.listed_signatures = listed_signatures
        self.signing_key = signing_key
        self.spill = spill
        self.batch = max(batch, 1)
        self.confirmed = confirmed
        self.shas: dict[str, str] = {}  # call_id -> the digest of its receipt file, read or reused
        # The call ids that have a receipt file, readable or not (with a spill: of the batch being filled).
        self.present: set[str] = set()

    def read(self, dir_fd: int | None, names: Collection[str] | None = None) -> None:
        """Every receipt of ``receipts/`` (``dir_fd``; ``None`` when the run has no such folder),
        or only those of ``names`` (file names) when the caller knows which may have changed."""
        if dir_fd is None:
            return
        too_long = Sentence("unsafe_path.receipt_name_too_long", limit=protocol.MAX_CALL_ID_LENGTH)
        for name, stem, subject in self.run.call_files(dir_fd, "receipts", too_long, names):
            if self.spill is not None and len(self.present) >= self.batch:
                self._spill()
            self.present.add(stem)
            self._read_one(dir_fd, name, stem, subject)

    def _read_one(self, dir_fd: int, name: str, stem: str, subject: str) -> None:
        signature = self.listed_signatures.get(name) or signature_of(name, dir_fd)
        known = self.known.get(stem)
        if known is not None and signature and signature == known.file_signature:
            self._keep_sha(stem, known.file_sha256)
            self.run.out.calls.append(known)
            self.run.out.reused_calls.add(stem)
            return
        found_before = len(self.run.out.findings)
        parsed = self.run.read_json(name, dir_fd, subject)
        call = None
        if parsed is not None:
            receipt, file_sha = parsed
            self._keep_sha(stem, file_sha)
            call = self.record(receipt, stem, file_sha, subject)
        if call is not None:
            call.file_signature = signature
            self.run.out.calls.append(call)
        elif len(self.run.out.findings) > found_before:  # not a file removed since it was listed
            self.run.out.unreadable_receipts[stem] = self.run.out.findings[found_before].code

    def _keep_sha(self, stem: str, file_sha: str) -> None:
        if self.confirmed is None or stem in self.confirmed:
            self.shas[stem] = file_sha

    def _spill(self) -> None:
        assert self.spill is not None
        self.spill.put((self.run.out.calls, self.present))
        self.run.out.calls, self.present = [], set()

    def batches(self) -> Iterator[tuple[list[CallRecord], set[str]]]:
        """The records read and the call ids that have a receipt file, a batch at a time:
        those spilled, then the last (with no spill, all of them in one)."""
        if self.spill is not None:
            yield from self.spill
        calls, present = self.run.out.calls, self.present
        self.run.out.calls, self.present = [], set()
        yield calls, present

    def record(self, receipt: Any, stem: str, file_sha: str, subject: str) -> CallRecord | None:
        if not isinstance(receipt, dict):
            self.run.finding("schema_error", subject, Sentence("schema_error.receipt_not_object"))
            return None
        missing = [
            name
            for name, kind in (("call_id", str), ("status", str), ("tool", str), ("args", dict))
            if not isinstance(receipt.get(name), kind)
        ]
        if missing:
            self.run.finding(
                "schema_error",
                subject,
                Sentence("schema_error.missing_or_wrong_type", fields=", ".join(missing)),
                call_id=stem,
            )
            return None
        call = CallRecord(
            call_id=stem,
            file_sha256=file_sha,
            declared_call_id=receipt["call_id"],
            status=receipt["status"][:32],
            tool=receipt["tool"],
            args=receipt["args"],
        )
        _optional_fields(self.run, receipt, call, subject)
        call.recomputed_input_sha256 = protocol.input_sha256(call.args)
        self.check_identity(receipt, call, subject)
        _check_status(self.run, call, subject)
        self.run.storable(call, subject)
        return call

    def check_identity(self, receipt: dict[str, Any], call: CallRecord, subject: str) -> None:
        """The protocol's one identity check; each problem it names is a finding."""
        check = protocol.check_receipt_identity(
            receipt,
            call_id=call.call_id,
            contract_sha256=self.run.out.contract_sha256 or None,
            signing_key=self.signing_key,
        )
        call.verification = check.verdict
        call.recomputed_call_id = check.recomputed_call_id
        for code, detail, stored, recomputed in check.problems:
            self.run.mismatch(code, subject, detail, stored, recomputed, call_id=call.call_id)


def _optional_fields(run: RunContext, receipt: dict[str, Any], call: CallRecord, subject: str) -> None:
    texts = ("identity", "contract_sha256", "tool_version", "input_sha256", "output_sha256")
    wrong = copy_fields(receipt, call, texts, str, "")
    attempt = receipt.get("attempt")
    if attempt is not None and not protocol.is_whole_number(attempt):
        wrong.append(f"attempt (a whole number from 0 to {protocol.MAX_INT})")
    elif attempt is not None:
        call.attempt = attempt
    wrong += copy_fields(receipt, call, ("result", "error"), dict, None)
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
        run.finding(
            "schema_error", subject, Sentence("schema_error.wrong_type", fields=", ".join(wrong)), call_id=call.call_id
        )


def _check_status(run: RunContext, call: CallRecord, subject: str) -> None:
    if call.status == protocol.LEGACY_STATUS:
        run.finding("legacy_status", subject, Sentence("legacy_status.failed"), call_id=call.call_id)
    elif call.status not in protocol.RECEIPT_STATUSES:
        run.finding(
            "invalid_status", subject, Sentence("invalid_status.status", status=repr(call.status)), call_id=call.call_id
        )


def check_stale_call(run: RunContext, call: CallRecord) -> None:
    """An open call (``protocol.OPEN_STATUSES``) unconfirmed past the stale age is a finding."""
    since = call.updated_at or call.created_at
    if not run.past_stale_age(since):
        return
    run.finding(
        "stale_call",
        f"receipts/{call.call_id}.json",
        Sentence("stale_call.since", status=call.status, since=protocol.human_time(since)),
        call_id=call.call_id,
    )
