"""Decisions travel back: a person's decision, written into the run directory by its host.

Settling records the decision in the database (``settle.settle_call``). The web
process writes it into the run directory at once only when it is on the run's
host; otherwise the importer of that host (``import_runs --watch``, before each
pass) delivers it through the writer: ``runtime.confirm_call`` under the call's
lock, exactly as a person at that machine would with ``python -m receipts
confirm``. Delivery is idempotent: the confirmation id is the digest of the
call, the resolution and the receipt seen, so delivering again finds it there;
a kill between the file and its ledger event is repaired by the writer. A
decision the run directory refuses (the receipt changed since the person saw
it, or another decision is already there) is never written: it is marked
undeliverable, the call is in doubt again, and a ``decision_undeliverable``
finding says why.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from django.db import DatabaseError, connection, transaction
from django.db.models.functions import Now

from evidence.ingest import storing
from evidence.lib import hosts, stats
from evidence.models import Call, Host, HumanDecision
from evidence.review import settle
from receipts import protocol, runtime
from receipts.confined import UnsafePath, not_a_symlink
from receipts.findings import STICKY, FindingRecord, Sentence
from receipts.recovery import decide

log = logging.getLogger("callproof.delivery")

DELIVERED, REFUSED, FAILED = "delivered", "refused", "failed"
WITHDRAWN = "withdrawn"  # taken back by a person before it was written (``withdrawal``): nothing to write


@dataclasses.dataclass
class DeliveryReport:
    delivered: int = 0
    refused: int = 0
    failed: int = 0
    withdrawn: int = 0


def pending_for(host: Host, limit: int | None = None) -> list[HumanDecision]:
    """The decisions about this host's runs not yet written (on their partial index), oldest
    first; the ``limit`` oldest."""
    rows = HumanDecision.objects.filter(run__host=host, delivered_at__isnull=True, undeliverable="")
    return list(rows.select_related("run", "run__host").order_by("decided_at", "id")[:limit])


def deliver_pending(*, host: Host, now: dt.datetime | None = None) -> DeliveryReport:
    """Write every decision still due into this host's run directories."""
    report = DeliveryReport()
    for decision in pending_for(host):
        outcome = deliver(decision, host_name=host.name, now=now)
        setattr(report, outcome, getattr(report, outcome) + 1)
    return report


def deliver(decision: HumanDecision, *, host_name: str, now: dt.datetime | None = None) -> str:
    """Write one decision into its run directory: ``delivered``, ``refused`` (never will be) or
    ``failed`` (the directory could not be written now: tried again at the next pass)."""
    delivered_at = now or Now()  # the database's clock: the page judges it beside the web's, not this host's
    now = now or protocol.utc_now()
    run = decision.run
    with storing.run_import_lock(run.run_id):
        if not HumanDecision.objects.filter(pk=decision.pk).exists():
            return WITHDRAWN  # withdrawn (under this lock) since it was listed
        decision.refresh_from_db()
        if not decision.pending:
            return DELIVERED if decision.delivered_at else REFUSED
        try:
            run_dir = not_a_symlink(Path(run.path))  # before the writer makes anything in it
        except UnsafePath as unsafe:
            refuse(decision, str(unsafe), now)
            return REFUSED
        try:
            document, _ = runtime.confirm_call(
                run_dir,
                decision.call_id,
                resolution=decision.resolution,
                reason=decision.reason,
                actor=decision.actor,
                receipt_sha256=decision.receipt_sha256,
                confirmed_at=protocol.format_time(decision.decided_at),
            )
        except runtime.ConfirmationRefused as refused:
            refuse(decision, runtime.refusal_text(refused), now)
            return REFUSED
        except (OSError, UnsafePath, ValueError) as error:
            problem = f"{type(error).__name__}: {error}"[:2000]
            HumanDecision.objects.filter(pk=decision.pk).update(delivery_error=problem)
            where = {"run_id": run.run_id, "call_id": decision.call_id}
            log.warning("decision not delivered yet", extra={"event": "delivery_failed", "detail": problem, **where})
            return FAILED
        with transaction.atomic():
            delivered = {"delivered_at": delivered_at, "delivered_by": host_name, "delivery_error": ""}
            HumanDecision.objects.filter(pk=decision.pk).update(**delivered)
            call = Call.objects.get(run=run, call_id=decision.call_id)
            settle.record_confirmation(run=run, call=call, document=document, now=now)
    log.info(
        "decision delivered",
        extra={"event": "decision_delivered", "run_id": run.run_id, "call_id": decision.call_id, "host": host_name},
    )  # fmt: skip
    return DELIVERED


def refuse(decision: HumanDecision, why: str, now: dt.datetime) -> None:
    """Never written: marked so, the call in doubt again, and a finding that stays until a person looks."""
    run = decision.run
    with transaction.atomic():
        HumanDecision.objects.filter(pk=decision.pk).update(undeliverable=why, delivery_error="")
        call = Call.objects.filter(run=run, call_id=decision.call_id).first()
        if call is not None:
            again = decide(status=call.status or None, error_kind=call.error_kind or None, queryable=call.queryable,
                           verification=call.verification)  # fmt: skip
            Call.objects.filter(pk=call.pk).update(decision=again.decision, decision_reason=again.reason)
        detail = Sentence("decision_undeliverable.why", actor=decision.actor, resolution=decision.resolution,
                          reason=repr(decision.reason), why=why)  # fmt: skip
        finding = FindingRecord("decision_undeliverable", f"decision/{decision.call_id}", detail,
                                call_id=decision.call_id, scope=STICKY)  # fmt: skip
        storing.store_findings(run, [finding], now)
        stats.refresh_run_summary(run)
    log.warning(
        "decision undeliverable",
        extra={"event": "decision_undeliverable", "run_id": run.run_id, "call_id": decision.call_id, "detail": why},
    )  # fmt: skip


class BesideThePass:
    """Delivers the host's decisions, and says the watch is alive, every ``every`` seconds from a
    thread of its own (its own database connection) while a pass imports: a decision about one
    run never waits behind the import of another, however long, and a host busy with a big
    import is not silent. A run being imported at that moment gets its decision when its
    import lets go of the run's lock.

    On PostgreSQL only. On SQLite a second connection's write while the pass reads would break
    the pass's own next write ("database is locked"), and one machine serves it all: the web
    process writes a decision at once on its own host (``settle``); the watch delivers before
    each pass."""

    def __init__(self, host: Host, *, every: float = 1.0, say: Callable[[str], None] = print) -> None:
        self.host = host
        self.every = every
        self.say = say
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.work, name=f"deliver-{host.name}", daemon=True)

    def work(self) -> None:
        try:
            while not self.stopping.wait(self.every):
                try:
                    hosts.alive(self.host)  # LeaseLostError: another holds the name, deliver nothing more
                    report = deliver_pending(host=self.host)
                except DatabaseError as error:  # the pass finds it too; try again with a new connection
                    connection.close()
                    self.say(f"delivery beside the pass failed, trying again: {error}")
                    continue
                if report.delivered or report.refused or report.failed:
                    self.say(f"decisions beside the pass: {report.delivered} delivered, {report.refused} refused, "
                             f"{report.failed} to try again")  # fmt: skip
        except hosts.LeaseLostError:
            return  # the watch's own next check stops it
        finally:
            connection.close()  # this thread's own connection

    def __enter__(self) -> BesideThePass:
        if connection.vendor == "postgresql":
            self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join()
