"""Recovery decisions: what a resuming runtime does with each call, with no side effect.

Standard library only. ``decide`` is the rule; ``replay_run`` applies it to a
run directory for ``python -m receipts replay``. The dashboard applies the same
rule to imported rows.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.runtime import confirmation_problem, read_json_file

DECISIONS = ("reuse", "retry", "stop", "query", "confirm")


@dataclasses.dataclass(frozen=True)
class Decision:
    decision: str
    reason: str


def decide(
    *,
    status: str | None,
    error_kind: str | None = None,
    queryable: bool = False,
    confirmation: str | None = None,
) -> Decision:
    """The recovery decision for one call.

    ``confirmation`` is the resolution of a valid human confirmation
    (``committed`` or ``rejected``), or ``None``.
    """
    if status == "committed":
        return Decision("reuse", "committed: its result is reused, never executed again")
    if status in ("prepared", "unknown"):
        if confirmation == "committed":
            return Decision("reuse", f"{status}, confirmed committed by a person: reuse, never execute again")
        if confirmation == "rejected":
            return Decision("retry", f"{status}, confirmed not done by a person: retry under the next attempt")
        if queryable:
            return Decision("query", f"{status}: the adapter asks the target whether the effect happened")
        return Decision("confirm", f"{status} and not queryable: a person must decide whether it happened")
    if status == "rejected":
        if error_kind == "retryable":
            return Decision("retry", "rejected with a retryable error: retry under the next attempt")
        if error_kind == "permanent":
            return Decision("stop", "rejected permanently: retrying cannot help")
        return Decision("stop", f"rejected with error kind {error_kind!r}: not known to be retryable")
    if status == protocol.LEGACY_STATUS:
        return Decision("confirm", "legacy status 'failed' cannot tell retryable from permanent: a person decides")
    if status is None:
        return Decision("confirm", "the ledger names this call but its receipt is missing: a person decides")
    return Decision("confirm", f"status {status!r} is not a receipt state: a person decides")


def _ledger_call_ids(ledger: Path) -> list[str]:
    """Call ids named by complete, valid ledger lines, in first-seen order."""
    seen: dict[str, None] = {}
    try:
        handle = ledger.open("rb")
    except FileNotFoundError:
        return []
    with handle:
        for line in handle:
            if not line.endswith(b"\n"):
                break  # a write in progress
            try:
                event = protocol.load_json_strict(line[:-1])
            except ValueError:
                continue
            if isinstance(event, dict) and isinstance(event.get("call_id"), str):
                seen.setdefault(event["call_id"], None)
    return list(seen)


def replay_run(run_dir: Path) -> dict[str, Any]:
    """Decisions for every receipt and every call_id the ledger names."""
    run_dir = Path(run_dir)
    receipts: dict[str, tuple[Any, bytes | None]] = {}
    receipts_dir = run_dir / "receipts"
    if receipts_dir.is_dir():
        for path in sorted(receipts_dir.iterdir()):
            if path.name.startswith(".") or path.suffix != ".json" or path.is_symlink() or not path.is_file():
                continue
            data = path.read_bytes()
            try:
                receipts[path.stem] = (protocol.load_json_strict(data), data)
            except ValueError:
                receipts[path.stem] = (None, data)
    call_ids = list(receipts) + [
        call_id for call_id in _ledger_call_ids(run_dir / "events.jsonl") if call_id not in receipts
    ]
    decisions = []
    for call_id in call_ids:
        receipt, data = receipts.get(call_id, (None, None))
        receipt = receipt if isinstance(receipt, dict) else {}
        status = receipt.get("status") if data is not None else None
        if data is not None and not receipt:
            status = "unreadable"
        error = receipt.get("error")
        try:
            confirmation_doc = read_json_file(run_dir / "confirmations" / f"{call_id}.json")
        except ValueError:
            confirmation_doc = None
        valid = confirmation_doc is not None and confirmation_problem(confirmation_doc, call_id, data) is None
        decision = decide(
            status=status,
            error_kind=error.get("kind") if isinstance(error, dict) else None,
            queryable=receipt.get("queryable") is True,
            confirmation=confirmation_doc["resolution"] if valid else None,
        )
        decisions.append(
            {"call_id": call_id, "status": status, "decision": decision.decision, "reason": decision.reason}
        )
    return {"run_id": run_dir.name, "decisions": decisions}
