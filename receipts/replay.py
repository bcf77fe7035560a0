"""Replay: the recovery decision of every call of a run, read with no side effect.

Standard library only. The rule is ``recovery.decide``; ``apply_decisions``
applies it to what the reader read, for ``python -m receipts replay`` and for
the importer.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receipts.builtin_tools import BUILTIN_ADAPTERS
from receipts.reader import RunFiles, read_run
from receipts.recovery import decide
from receipts.signing import run_keys
from receipts.tools import tool_can_query


def apply_decisions(
    files: RunFiles, adapters: Mapping[str, Any] | None = None, decided: Mapping[str, tuple[str, str]] | None = None
) -> None:
    """Set each call's decision and reason from its receipt and confirmation.

    ``decided``: decisions made elsewhere and not yet in the run directory (the
    dashboard's, waiting for their host), ``call_id -> (resolution, receipt_sha256)``:
    followed where the files hold no valid confirmation and the receipt is the one
    decided on, as the confirmation will be once it is written.

    Whether a call can be queried is what its tool's adapter declares
    (``adapters``, the built-ins by default: a tool not among them cannot),
    never the receipt's ``queryable``: a file edited to say true would have
    replay promise a query that the writer, with its adapter, never makes.
    The record's ``queryable`` is set to that capability.
    """
    adapters = BUILTIN_ADAPTERS if adapters is None else adapters
    resolutions = {c.call_id: c.resolution for c in files.confirmations if c.valid}
    if decided:
        shas = {call.call_id: call.file_sha256 for call in files.calls if call.receipt_present}
        for call_id, (resolution, receipt_sha256) in decided.items():
            if call_id not in resolutions and shas.get(call_id) == receipt_sha256:
                resolutions[call_id] = resolution
    for call in files.calls:
        call.queryable = tool_can_query(adapters, call.tool)
        decision = decide(
            status=call.status if call.receipt_present else None,
            error_kind=call.error_kind or None,
            queryable=call.queryable,
            confirmation=resolutions.get(call.call_id),
            verification=call.verification,
        )
        call.decision, call.decision_reason = decision.decision, decision.reason


def replay_run(run_dir: Path, adapters: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Decisions for every receipt and every call_id the ledger names, read with no side effect."""
    files, _ = read_run(Path(run_dir), keep_events=False, keys=run_keys())
    apply_decisions(files, adapters)
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
        ]
        + [
            {
                "call_id": call_id,
                "status": None,
                "decision": "confirm",
                "reason": f"its receipt file cannot be read ({code}: see the reader's findings): a person decides",
            }
            for call_id, code in sorted(files.unreadable_receipts.items())
        ],
    }
