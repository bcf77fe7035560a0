"""A decision's consequence, checked: what the target of a decided call shows after the runtime followed it.

A person settles a call in doubt against what they know; the runtime follows the decision when it
resumes: "it happened" reuses the result, "it did not happen" does the call again under the next
attempt. When the decision was wrong, the effect is made twice and nothing in the records says so:
the receipts and the ledger are all in order.

So at every import that stores the run's files, each valid confirmation (the decision the runtime
follows, made on the dashboard or on the host) is held against its call's target, read as the doubt
panel reads it (``receipts.doubt.evidence_for``). A target that shows the effect a decision said did
not happen, or shows the effect more than once for the one call_id, opens a
``decision_contradicted`` finding: an inbox item that stays open until a person deals with it (the
effect made twice does not go away by itself). Nothing is written to the run directory.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

from evidence.ingest import storing
from evidence.models import Call, Confirmation, Run
from receipts import doubt
from receipts.findings import STICKY, FindingRecord, Sentence

log = logging.getLogger("callproof.consequences")

CODE = "decision_contradicted"
# The decisions checked at one import: the newest. Each reads its target (an outbox's last 8 MiB), and a
# runtime resumes soon after a decision, so an old decision's consequence was checked when it was new.
CHECKED = 100


def finding_subject(call_id: str) -> str:
    """The decision the target contradicts: its file."""
    return f"confirmations/{call_id}.json"


def contradiction(resolution: str, evidence: doubt.Evidence | None) -> str:
    """The finding's sentence when ``evidence`` contradicts a decision of ``resolution``; "" when it does not."""
    if evidence is None:
        return ""
    if resolution == "rejected" and evidence.verdict == doubt.PRESENT:
        return f"{CODE}.not_done"
    if doubt.times_shown(evidence) > 1:
        return f"{CODE}.more_than_once"
    return ""


def check(run: Run, path: Path, now: dt.datetime) -> None:
    """Each decided call's target, held against its decision; a finding for each it contradicts.
    In the import's transaction, under the run's lock."""
    newest = Confirmation.objects.filter(run=run, valid=True).order_by("-confirmed_at", "-id")[:CHECKED]
    rows = list(newest.values_list("call_id", "resolution", "actor"))
    if not rows:
        return
    decided = {call_id: resolution for call_id, resolution, _actor in rows}
    actors = {call_id: actor for call_id, _resolution, actor in rows}
    calls = Call.objects.filter(run=run, call_id__in=list(decided), receipt_present=True)
    found = []
    for call_id, tool, args in calls.values_list("call_id", "tool", "args"):
        resolution = decided[call_id]
        evidence = doubt.evidence_for(path, tool, args, call_id)
        key = contradiction(resolution, evidence)
        if not key:
            continue
        assert evidence is not None  # a contradiction is of evidence
        detail = Sentence(
            key,
            actor=repr(actors.get(call_id, "")),
            resolution=resolution,
            times=max(doubt.times_shown(evidence), 1),
            facts="; ".join(evidence.facts),
        )
        found.append(FindingRecord(CODE, finding_subject(call_id), detail, call_id=call_id, scope=STICKY))
        log.warning(
            "decision contradicted",
            extra={"event": CODE, "run_id": run.run_id, "call_id": call_id, "resolution": resolution,
                   "verdict": evidence.verdict},
        )  # fmt: skip
    if found:
        storing.store_findings(run, found, now)
