"""The finding codes of RUN_DIRECTORY.md: severity, scope, and what each means.

Standard library only: the reader produces ``FindingRecord``s, the importer
stores them.
"""

from __future__ import annotations

import dataclasses

ERROR, WARNING = "error", "warning"
# Scopes: when a stored finding is checked again, and so when it can close.
FILES = "files"  # re-checked on every import: closed when not seen again
LEDGER = "ledger"  # about ledger lines: re-checked only when the ledger is read from scratch
STICKY = "sticky"  # a rewritten ledger: stays open until a person deals with it
ACTIVITY = "activity"  # a run's silence: re-checked by every pass that checks the run, from its rows

CODES: dict[str, tuple[str, str]] = {
    # code: (severity, meaning)
    "invalid_json": (ERROR, "not valid JSON under the run directory's rules"),
    "schema_error": (ERROR, "valid JSON, wrong shape"),
    "unsafe_path": (ERROR, "symlink, path escaping the run directory, non-regular file, or bad name"),
    "oversize": (ERROR, "file or ledger line over the size limit"),
    "not_a_run": (WARNING, "an entry of the runs root that is not a run directory"),
    "duplicate_run_id": (ERROR, "a run_id already imported from another runs root: refused"),
    "archived_run_id_reused": (ERROR, "another run under an archived run's id: not imported, never removed"),
    "receipt_name_mismatch": (ERROR, "file stem differs from call_id"),
    "identity_mismatch": (ERROR, "recomputed call_id differs from call_id"),
    "identity_unverifiable": (WARNING, "not enough fields to recompute the call_id"),
    "contract_mismatch": (ERROR, "receipt's contract_sha256 differs from steer.json"),
    "input_digest_mismatch": (ERROR, "input_sha256 differs from the args' digest"),
    "output_digest_mismatch": (ERROR, "a committed receipt's output_sha256 differs from its result's digest"),
    "committed_event_missing": (ERROR, "a committed receipt whose commit no ledger event records"),
    "effect_not_shown": (ERROR, "a commit the writer refused to reuse: its target did not show the result"),
    "invalid_status": (ERROR, "status outside prepared, committed, rejected, unknown"),
    "legacy_status": (WARNING, "legacy status 'failed': retryable or permanent is unknown"),
    "missing_receipt": (ERROR, "the ledger names a call_id with no receipt file"),
    "orphan_receipt": (WARNING, "a receipt the ledger never names"),
    "ledger_seq_gap": (ERROR, "seq skips numbers"),
    "ledger_seq_duplicate": (ERROR, "seq repeats or goes back"),
    "ledger_chain_broken": (ERROR, "prev_sha256 does not match the previous line"),
    "ledger_rewritten": (ERROR, "bytes already imported have changed since"),
    "submission_digest_mismatch": (ERROR, "stored request does not give the stored digest"),
    "submission_conflict": (WARNING, "a conflict disposition, or one id seen with two digests"),
    "task_missing": (ERROR, "task file absent"),
    "task_digest_mismatch": (ERROR, "task file is not the recorded digest"),
    "stale_reservation": (WARNING, "reserved or task_created past the stale age"),
    "stale_call": (WARNING, "prepared or unknown past the stale age, unconfirmed"),
    "confirmation_invalid": (ERROR, "a confirmation file that does not match its receipt"),
    "signature_invalid": (ERROR, "in a signed run, a record whose signature does not verify with the run's key"),
    "signature_missing": (
        ERROR,
        "a record of a signed run without a signature, or an unsigned run where signed ones are required",
    ),
    "signature_unchecked": (WARNING, "a signed run whose key this reader does not have: signatures not checked"),
    "unstorable_value": (WARNING, "a value the database cannot hold as written: stored with U+FFFD in its place"),
    "import_failed": (ERROR, "the run's import failed for a reason nobody foresaw: rolled back"),
    "decision_undeliverable": (
        ERROR,
        "a person's decision its host could not write into the run: the receipt changed since, or another is there",
    ),
    "run_abandoned": (
        WARNING,
        "not finished, and no event for EVIDENCE_ABANDONED_AFTER_SECONDS: no longer checked every pass",
    ),
}

# The digest mismatches: shown first on the findings page, stored beside recomputed.
DIGEST_CODES = (
    "identity_mismatch",
    "input_digest_mismatch",
    "output_digest_mismatch",
    "contract_mismatch",
    "submission_digest_mismatch",
    "task_digest_mismatch",
    "ledger_chain_broken",
    "ledger_rewritten",
)


def storable_text(text: str) -> str:
    """``text`` as any database can hold it: U+0000 becomes U+FFFD, and the bytes of a
    name that is not UTF-8 (surrogate escapes) are spelled as ``\\xNN``."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text


@dataclasses.dataclass(frozen=True)
class FindingRecord:
    code: str
    subject: str
    detail: str
    call_id: str = ""
    stored_value: str = ""
    recomputed_value: str = ""
    scope: str = FILES
    evidence: str = ""  # what no other row keeps: a ledger line whose seq was taken
    record_key: str = ""  # the submission record a finding is about (its file stem)

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unknown finding code {self.code!r}")
        # Subjects and details quote what was found, which may be anything: make it storable here, once.
        for name in ("subject", "detail", "call_id", "stored_value", "recomputed_value"):
            object.__setattr__(self, name, storable_text(getattr(self, name)))

    @property
    def severity(self) -> str:
        return CODES[self.code][0]
