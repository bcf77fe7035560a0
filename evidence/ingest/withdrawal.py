"""A decision taken back before it reached the run: withdrawn while its host has not written it.

A decision made on the dashboard for a run whose files are on another host waits in the database
until that host writes it into the run directory (``delivery``). Until then nothing the runtime
reads holds it, and a person allowed to settle can take it back: the decision leaves
``HumanDecision`` and an audit entry (``AuditEntry.DECISION_WITHDRAWN``) keeps it whole (its
answer, who decided, when, and why) with who withdrew it; the call is in doubt again, and anyone
may decide it afresh. A decision written into the run directory is what the runtime follows: it
is never withdrawn (a decision the directory refused stays on record as refused).

The withdrawal holds the run's import lock, the one delivery holds while it writes: a decision is
either written, and then not withdrawn, or withdrawn, and then never written.
"""

from __future__ import annotations

import datetime as dt
import logging
from http import HTTPStatus

from django.contrib.auth.models import User
from django.db import transaction

from evidence.ingest import storing
from evidence.lib import stats
from evidence.models import AuditEntry, Call, HumanDecision, Run
from evidence.review import settle
from receipts import protocol
from receipts.recovery import decide

log = logging.getLogger("callproof.withdrawal")


def audit_reason(decision: HumanDecision) -> str:
    """The audit entry's reason: the withdrawn decision as it was, in English
    (``evidence.words.audit_words`` words it for a page)."""
    return (
        f"{decision.resolution}, decided by {decision.actor} at {protocol.format_time(decision.decided_at)}: "
        f"{decision.reason}"
    )


def withdraw(*, run: Run, call: Call, user: User, now: dt.datetime | None = None) -> HumanDecision:
    """Take back the dashboard's decision about ``call``, not yet written into its run directory;
    returns it as it was. Refused (``settle.SettleError``) when there is none, when it was written
    (the runtime follows it), or when the run directory refused it."""
    now = now or protocol.utc_now()
    with storing.run_import_lock(run.run_id), transaction.atomic():
        Call.objects.select_for_update().filter(pk=call.pk).first()  # people queue here, as to settle
        decision = HumanDecision.objects.select_for_update().filter(run=run, call_id=call.call_id).first()
        if decision is None:
            raise settle.SettleError(HTTPStatus.CONFLICT, settle.NOT_DECIDED)
        if decision.delivered_at is not None:
            values = {"host": decision.delivered_by, "time": decision.delivered_at}
            raise settle.SettleError(HTTPStatus.CONFLICT, settle.ALREADY_DELIVERED, values, existing=decision)
        if decision.undeliverable:
            values = {"why": decision.undeliverable}
            raise settle.SettleError(HTTPStatus.CONFLICT, settle.NOT_WITHDRAWABLE, values, existing=decision)
        AuditEntry.objects.create(
            run=run,
            action=AuditEntry.DECISION_WITHDRAWN,
            subject=call.call_id,
            actor=user.get_username(),
            user=user,
            at=now,
            reason=audit_reason(decision),
        )
        decision.delete()
        # In doubt again, as it was before the decision: the rows follow what the run directory holds.
        call = Call.objects.get(pk=call.pk)
        again = decide(status=call.status or None, error_kind=call.error_kind or None, queryable=call.queryable,
                       verification=call.verification)  # fmt: skip
        Call.objects.filter(pk=call.pk).update(decision=again.decision, decision_reason=again.reason)
        stats.refresh_run_summary(run)
    log.info(
        "decision withdrawn",
        extra={"event": "decision_withdrawn", "run_id": run.run_id, "call_id": call.call_id,
               "resolution": decision.resolution, "actor": user.get_username()},
    )  # fmt: skip
    return decision
