"""Replay: the recovery decision of every call of a run, read with no side effect.

Standard library only. The rule is ``recovery.decide``; ``apply_decisions``
applies it to what the reader read, for ``python -m receipts replay`` and for
the importer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from receipts.builtin_tools import BUILTIN_ADAPTERS
from receipts.reader import CallRecord, ConfirmationRecord, RunFiles, read_run
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
    decide_calls(files.calls, resolutions_of(files.confirmations), adapters, decided)


def resolutions_of(confirmations: Iterable[ConfirmationRecord]) -> dict[str, str]:
    """The resolution of each call a valid confirmation settles, by call id."""
    return {c.call_id: c.resolution for c in confirmations if c.valid}


def decide_calls(
    calls: Iterable[CallRecord],
    resolutions: Mapping[str, str],
    adapters: Mapping[str, Any] | None = None,
    decided: Mapping[str, tuple[str, str]] | None = None,
) -> None:
    """``apply_decisions`` for some of a run's calls (a batch of them): ``resolutions`` from
    the run's confirmations (``resolutions_of``), ``decided`` as there."""
    adapters = BUILTIN_ADAPTERS if adapters is None else adapters
    decided = decided or {}
    for call in calls:
        call.queryable = tool_can_query(adapters, call.tool)
        resolution = resolutions.get(call.call_id)
        elsewhere = decided.get(call.call_id) if resolution is None else None
        if elsewhere is not None and call.receipt_present and call.file_sha256 == elsewhere[1]:
            resolution = elsewhere[0]  # the receipt decided on: as its confirmation will say
        decision = decide(
            status=call.status if call.receipt_present else None,
            error_kind=call.error_kind or None,
            queryable=call.queryable,
            confirmation=resolution,
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
