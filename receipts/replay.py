"""Replay: the recovery decision of every call of a run, read with no side effect.

Standard library only. The rule is ``recovery.decide``; ``apply_decisions``
applies it to what the reader read, for ``python -m receipts replay`` and for
the importer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from receipts.reader import RunFiles, read_run
from receipts.recovery import decide


def apply_decisions(files: RunFiles) -> None:
    """Set each call's decision and reason from its receipt and confirmation."""
    resolutions = {c.call_id: c.resolution for c in files.confirmations if c.valid}
    for call in files.calls:
        decision = decide(
            status=call.status if call.receipt_present else None,
            error_kind=call.error_kind or None,
            queryable=call.queryable,
            confirmation=resolutions.get(call.call_id),
            verification=call.verification,
        )
        call.decision, call.decision_reason = decision.decision, decision.reason


def replay_run(run_dir: Path) -> dict[str, Any]:
    """Decisions for every receipt and every call_id the ledger names, read with no side effect."""
    files, _ = read_run(Path(run_dir), keep_events=False)
    apply_decisions(files)
    return {
        "run_id": files.run_id,
        "decisions": [
            {
                "call_id": call.call_id,
                "status": call.status if call.receipt_present else None,
                "decision": call.decision,
                "reason": call.decision_reason,
            }
            for call in files.calls
        ],
    }
