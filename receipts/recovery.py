"""Recovery decisions: what a resuming runtime does with each call, and with each reservation.

Plain rules over facts, with no file read and no side effect: the writer's
behaviour, said in advance. Imports only the protocol, so the dashboard's
read layer can ask without loading the file reader.
"""

from __future__ import annotations

import dataclasses

from receipts import protocol, states


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
    verification: str = protocol.VERIFIED,
) -> Decision:
    """The recovery decision for one call.

    ``confirmation`` is the resolution of a valid human confirmation
    (``committed`` or ``rejected``), or ``None``. ``verification`` is the
    verdict of ``protocol.check_receipt_identity`` (or ``disputed``, from the
    ledger): a receipt that does not pass it (altered, misfiled, missing an
    input, or a commit its target did not show) proves nothing, so a person
    decides, as the writer does. ``queryable`` is what the tool's adapter
    declares, never what a receipt file claims. A person's decision, bound to the exact receipt
    bytes they saw, is followed whatever the receipt says.
    """
    if status is not None and confirmation == "committed":
        return Decision("reuse", f"{status}, confirmed committed by a person: reuse, never execute again")
    if status is not None and confirmation == "rejected":
        return Decision("retry", f"{status}, confirmed not done by a person: retry under the next attempt")
    if status is not None and verification == protocol.MISMATCH:
        return Decision("confirm", "the receipt does not pass its identity check (altered?): a person must decide")
    if status is not None and verification == protocol.DISPUTED:
        return Decision("confirm", "committed, but its target did not show the result: the writer refused to reuse it")
    if status is not None and verification != protocol.VERIFIED:
        return Decision("confirm", "the receipt's identity cannot be checked (an input is missing): a person decides")
    if status == "committed":
        return Decision("reuse", "committed: its result is reused, never executed again")
    if status in protocol.OPEN_STATUSES:
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


# What a page shows for a call a person settled: the decision their confirmation gave it.
SETTLED_SHOWN = {"reuse": "settled: committed", "retry": "settled: rejected"}


def shown_status(*, present: bool, status: str, verification: str, decision: str) -> str:
    """The one rule for what a call shows as, on every page, bar, download, export, alert and API
    answer: one of the states of ``receipts.reader.states.STATES``, never a receipt's own word
    for a call in doubt (its receipt's ``status`` says that).

    A receipt that fails its identity check is "tampered", even after a person settled it, since
    settling does not make its bytes true. A call in doubt that a person settled shows as what
    they settled it as. A committed receipt whose target did not show the result is "disputed"
    until a person settles it; any other call in doubt (prepared, unknown, a receipt missing or
    one whose identity cannot be checked) is "in doubt".
    """
    if present and verification == protocol.MISMATCH:
        return states.TAMPERED
    unsettled = decide(status=(status or None) if present else None, verification=verification or protocol.VERIFIED)
    if not protocol.in_doubt(unsettled.decision):
        return status  # committed (reused) or rejected (retried or stopped)
    if present and (settled := SETTLED_SHOWN.get(decision)):
        return settled
    return states.DISPUTED if present and verification == protocol.DISPUTED else states.IN_DOUBT


def reservation_resume(*, state: str, task_present: bool, digests_match: bool) -> str:
    """What ``write_task`` does when the same submission is retried (RUN_DIRECTORY.md's rules)."""
    if state == "committed":
        return "reused: the first result is returned"
    if state == "reserved":
        if not task_present:
            return "creates the task file under the same task_id, then commits (created)"
        if digests_match:
            return "adopts the task file it finds (its own) and commits (created)"
        return "stops with a conflict (task_file_differs): another file holds the task's place"
    if state == "task_created":
        if not task_present:
            return "stops with a conflict (task_missing): a created task is never created again"
        if digests_match:
            return "commits (created)"
        return "stops with a conflict (task_digest_mismatch)"
    return f"stops with a conflict (record_invalid): state {state!r}"
