"""The same intent at the run's other attempts: what a resume of each would do, and the rule
that one still in doubt stops a new call of it (a person settles it, or an override says why).

A retry of a run computes new call_ids (the attempt is in the identity), so a call killed after
its effect at attempt 1 and made again at attempt 2 would make the effect twice. Before a call
runs, the writer looks for its intent at every attempt of the run, under each formula the run
may hold, and decides each as a resume would, from its files and its target, with no side effect.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.confined import read_file
from receipts.protocol import SigningKey
from receipts.recovery import Decision, decide
from receipts.runs import require_override
from receipts.runtime.call_records import commit_problem, read_confirmation, receipt_was_installed
from receipts.tools import Adapter, adapter_can_query


def check_other_attempts(
    run_dir: Path,
    adapter: Adapter,
    receipt: dict[str, Any],
    contract: str,
    current_attempt: int,
    override: str | None,
    key: SigningKey | None,
    recorded_formula: str | None,
) -> None:
    """The same intent still in doubt at another attempt of the run: running it now could make it twice."""
    attempt = receipt["attempt"]
    # A run that records no formula may hold the intent under either.
    formulas = [receipt["identity"]] if recorded_formula else list(protocol.IDENTITIES)
    unsettled = []
    for other in range(1, current_attempt + 1):
        for formula in formulas:
            if other == attempt and formula == receipt["identity"]:
                continue
            call_id = protocol.make_call_id(contract, other, adapter.name, receipt["args"], adapter.version, formula)
            decision = decision_of(run_dir, adapter, call_id, contract, key)
            if decision is not None and protocol.in_doubt(decision.decision):
                unsettled.append(call_id)
    if unsettled:
        action = f"call {receipt['call_id']} ({adapter.name}) at attempt {attempt}"
        require_override(run_dir, unsettled, override, action, f"attempt {attempt}")


def decision_of(
    run_dir: Path, adapter: Adapter, call_id: str, contract: str, key: SigningKey | None
) -> Decision | None:
    """What a resume of one call would do, from its files and its target (``None``: never made)."""
    try:
        data = read_file(run_dir / "receipts" / f"{call_id}.json", run_dir)
    except FileNotFoundError:
        if receipt_was_installed(run_dir, call_id):
            return decide(status=None)  # a receipt that was there and is gone: a person decides
        return None
    try:
        receipt = protocol.load_json_strict(data)
    except ValueError:
        receipt = None
    if not isinstance(receipt, dict):
        return decide(status="", verification=protocol.UNVERIFIABLE)
    confirmation = read_confirmation(run_dir, call_id, data, key)
    error = receipt.get("error")
    check = protocol.check_receipt_identity(receipt, call_id=call_id, contract_sha256=contract, signing_key=key)
    verdict = check.verdict
    if verdict == protocol.VERIFIED and receipt.get("status") == "committed":
        # The writer would not reuse a commit its target does not show: neither is it settled.
        verdict = protocol.DISPUTED if commit_problem(run_dir, adapter, receipt) else verdict
    return decide(
        status=str(receipt.get("status")),
        error_kind=str(error.get("kind")) if isinstance(error, dict) else None,
        queryable=adapter_can_query(adapter),
        confirmation=confirmation["resolution"] if confirmation else None,
        verification=verdict,
    )
