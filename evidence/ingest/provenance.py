"""Where a decision was made: on the dashboard, or on the run's host by a name in a file.

A confirmation in ``confirmations/`` settles a call for the runtime, whoever wrote it: the
writer's command line on the host (``python -m receipts confirm``), the runtime API, or the
dashboard's own decision written back (``settle``, ``delivery``). Only the last was made by a
dashboard account; the other two are the host's word, by whatever name its file gives.

At every import that stores the run's files, each valid confirmation is held against the
decisions made on the dashboard (``HumanDecision``): one for the same call whose
confirmation id is the file's (same call, same resolution, same receipt) made it; a
confirmation none matches was made on the run's host. It is marked so
(``Confirmation.made_on_host``, the host's name then), and once per confirmation (its id)
an audit entry says so and, unless the run is signed with a key this server trusts (its
signature verified with it), a ``decision_made_on_host`` finding opens: an inbox item a
person acknowledges. A re-import finds both there and writes neither again.

The call stays settled: the runtime follows the file, so nothing waits for a target or a
person (``protocol.in_doubt``, the one rule for "in doubt", is left as it is). What changes
is how the settlement is said: the host's word, never a dashboard account's.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

from evidence.ingest import storing
from evidence.models import AuditEntry, Confirmation, HumanDecision, Run
from evidence.review.host_decisions import CODE, finding_subject
from receipts.findings import STICKY, FindingRecord, Sentence

log = logging.getLogger("callproof.provenance")

ACTOR = "import"  # who wrote the audit entry: the import, as when it ends a triage


def audit_reason(*, resolution: str, host: str, actor: str, confirmation_id: str) -> str:
    """The audit entry's reason, in English (``evidence.words.audit_words`` words it for a page)."""
    return (
        f"{resolution} on host {host} by the name {actor!r}, not a dashboard account: no decision made on the "
        f"dashboard matches confirmation {confirmation_id}"
    )


def judge(run: Run, now: dt.datetime, trusted: Callable[[], bool]) -> None:
    """Mark each of the run's confirmations with where it was made; for each made on the host,
    its audit entry and, unless ``trusted()`` (the run is signed with a key this server trusts),
    its inbox item, each written once. In the import's transaction, under the run's lock."""
    rows = list(
        Confirmation.objects.filter(run=run).values_list(
            "pk", "call_id", "valid", "resolution", "actor", "confirmation_id", "made_on_host"
        )
    )
    if not rows:
        return
    matched = set(HumanDecision.objects.filter(run=run, undeliverable="").values_list("call_id", "confirmation_id"))
    host = run.host.name if run.host is not None else ""
    signed: bool | None = None
    for pk, call_id, valid, resolution, actor, confirmation_id, made_on_host in rows:
        on_host = valid and (call_id, confirmation_id) not in matched
        if not on_host:
            if made_on_host:
                Confirmation.objects.filter(pk=pk).update(made_on_host="")
            continue
        if not made_on_host:
            made_on_host = host or "?"
            Confirmation.objects.filter(pk=pk).update(made_on_host=made_on_host)
        reason = audit_reason(resolution=resolution, host=made_on_host, actor=actor, confirmation_id=confirmation_id)
        said = AuditEntry.objects.filter(
            run=run, action=AuditEntry.DECISION_MADE_ON_HOST, subject=call_id, reason=reason
        ).exists()
        if said:
            continue
        AuditEntry.objects.create(
            run=run, action=AuditEntry.DECISION_MADE_ON_HOST, subject=call_id, actor=ACTOR, at=now, reason=reason
        )
        if signed is None:
            signed = trusted()
        if not signed:
            detail = Sentence(f"{CODE}.by_name", resolution=resolution, host=made_on_host, actor=repr(actor))
            finding = FindingRecord(
                CODE, finding_subject(call_id, confirmation_id), detail, call_id=call_id, scope=STICKY
            )
            storing.store_findings(run, [finding], now)
        log.warning(
            "decision made on host",
            extra={"event": CODE, "run_id": run.run_id, "call_id": call_id, "host": made_on_host, "actor": actor,
                   "signed": signed},
        )  # fmt: skip
