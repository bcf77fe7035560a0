"""A decision its host made: the finding a confirmation no dashboard decision matches opens, and
the subject that names it (one item a confirmation). The import opens it
(``evidence.ingest.provenance``) and the call page finds it (``selectors``): both read it here."""

from __future__ import annotations

CODE = "decision_made_on_host"


def finding_subject(call_id: str, confirmation_id: str) -> str:
    """One inbox item a confirmation: its file, and which of the decisions that file has held."""
    return f"confirmations/{call_id}.json#{confirmation_id[:16]}"
