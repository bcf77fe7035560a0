"""A short title for each finding code, in the reader's language (docs/glossary.md).

The code itself (``stale_call``) is the protocol's name and what people search for: pages
show it as it is, as code, and this title beside it. A finding's detail is worded from its
sentence and values (evidence/words/finding_words.py). Every code the reader can emit
(``receipts.findings.CODES``) has a title here; tests/test_finding_titles.py says so.
"""

from __future__ import annotations

from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

TITLES: dict[str, Promise] = {
    "invalid_json": _("Not valid JSON"),
    "schema_error": _("Wrong shape"),
    "unsafe_path": _("Unsafe path or file"),
    "oversize": _("Over the size limit"),
    "not_a_run": _("Not a run directory"),
    "duplicate_run_id": _("Run id imported from another runs root"),
    "archived_run_id_reused": _("A new run under an archived run's id"),
    "receipt_name_mismatch": _("Receipt file name is not its call_id"),
    "identity_mismatch": _("Recomputed call_id differs"),
    "identity_unverifiable": _("call_id cannot be recomputed"),
    "contract_mismatch": _("Contract digest differs from steer.json"),
    "input_digest_mismatch": _("Input digest mismatch"),
    "output_digest_mismatch": _("Output digest mismatch"),
    "committed_event_missing": _("Commit missing from the ledger"),
    "effect_not_shown": _("Target did not show the result"),
    "receipt_contradicts_ledger": _("Receipt contradicts the ledger's commit"),
    "invalid_status": _("Invalid status"),
    "legacy_status": _("Legacy status “failed”"),
    "missing_receipt": _("Receipt missing"),
    "orphan_receipt": _("Receipt the ledger never names"),
    "ledger_seq_gap": _("Ledger skips sequence numbers"),
    "ledger_seq_duplicate": _("Ledger sequence repeats"),
    "ledger_chain_broken": _("Ledger hash chain broken"),
    "ledger_rewritten": _("Ledger rewritten after import"),
    "ledger_clock_back": _("Ledger time goes backwards"),
    "submission_digest_mismatch": _("Submission digest mismatch"),
    "submission_conflict": _("Submission conflict"),
    "task_missing": _("Task file missing"),
    "task_digest_mismatch": _("Task file digest mismatch"),
    "stale_reservation": _("Stale reservation"),
    "stale_call": _("Stale call"),
    "confirmation_invalid": _("Confirmation does not match its receipt"),
    "signature_invalid": _("Signature does not verify"),
    "signature_missing": _("Signature missing"),
    "signature_unchecked": _("Signatures not checked"),
    "unstorable_value": _("Value stored with replacement characters"),
    "import_failed": _("Import failed"),
    "decision_undeliverable": _("Decision could not be written into the run"),
    "decision_made_on_host": _("Decision made on a host, not on the dashboard"),
    "decision_contradicted": _("Decision contradicted by its target"),
    "run_abandoned": _("Run abandoned"),
    "host_clock_off": _("Host clock off"),
}


def title(code: object) -> str:
    """The title of a finding code in the reader's language; "" for a code nobody foresaw."""
    label = TITLES.get(code) if isinstance(code, str) else None
    return str(label) if label is not None else ""
