"""``/metrics``: what an operator graphs and alerts on, in Prometheus' text format.

Every value is read from the database when Prometheus scrapes, through a
collector (prometheus_client, the maintained client library): gunicorn's workers
share nothing but the database, so counters kept in one worker's memory would be
a guess. Each scrape is a handful of index-backed queries and one row per run
that is not finished.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterator

from django.conf import settings
from django.db.models import Count, F, FloatField, Max, Min, Sum
from django.db.models.functions import Cast
from django.http import HttpRequest
from django_tasks import TaskResultStatus
from django_tasks_db.models import DBTaskResult
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from evidence.lib import hosts
from evidence.lib.proxy import behind_proxy
from evidence.models import AuditEntry, Call, Confirmation, Finding, Host, HumanDecision, Run, ShippedRun
from receipts import protocol
from receipts.findings import DIGEST_CODES


def may_scrape(request: HttpRequest) -> bool:
    """With ``EVIDENCE_METRICS_TOKEN`` set, ``Authorization: Bearer <token>``. Without it, only
    a request made on this machine straight to the server, and only when no proxy is declared:
    behind a proxy every request arrives from loopback, so the token is the only door."""
    token = settings.EVIDENCE_METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())
    if behind_proxy() or "X-Forwarded-For" in request.headers:
        return False
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


def _seconds(moment) -> float:
    return moment.timestamp() if moment is not None else float("nan")


def _age(moment, now) -> float:
    """Seconds since ``moment``, 0 when there is none (an alert's "nothing waits")."""
    return max(0.0, (now - moment).total_seconds()) if moment is not None else 0.0


def oldest_in_doubt():
    """When the receipt of the oldest call in doubt was last written: one index probe per
    decision in doubt (``call_decision_updated_idx``), never a scan of the calls. A call the
    ledger names with no receipt has no such time and is counted by ``callproof_calls_in_doubt``."""
    found = [
        Call.objects.filter(decision=decision, updated_at__isnull=False)
        .order_by("updated_at")
        .values_list("updated_at", flat=True)
        .first()
        for decision in protocol.IN_DOUBT_DECISIONS
    ]
    return min((moment for moment in found if moment is not None), default=None)


class DashboardCollector(Collector):
    def queue(self, now) -> Iterator[GaugeMetricFamily]:
        """The background tasks' queue (a table: django-tasks' database backend)."""
        by_status = dict(DBTaskResult.objects.values_list("status").annotate(n=Count("id")).order_by())
        tasks = GaugeMetricFamily(
            "callproof_tasks",
            "Background tasks in the queue: waiting for a worker, running, and failed (kept until pruned)",
            labels=["state"],
        )
        for state, status in (("waiting", TaskResultStatus.READY), ("running", TaskResultStatus.RUNNING),
                              ("failed", TaskResultStatus.FAILED)):  # fmt: skip
            tasks.add_metric([state], by_status.get(status, 0))
        yield tasks
        oldest = DBTaskResult.objects.filter(status=TaskResultStatus.READY).aggregate(at=Min("enqueued_at"))["at"]
        waited = GaugeMetricFamily(
            "callproof_task_oldest_waiting_seconds",
            "How long the oldest waiting task has waited for a worker, 0 when none waits (a growing value: no worker)",
        )
        waited.add_metric([], _age(oldest, now))
        yield waited

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = protocol.utc_now()
        in_doubt = GaugeMetricFamily(
            "callproof_calls_in_doubt",
            "Calls whose recovery waits for the target or a person: open, altered, disputed or missing receipts",
        )
        in_doubt.add_metric([], Call.objects.in_doubt().count())
        yield in_doubt
        oldest_doubt = GaugeMetricFamily(
            "callproof_call_oldest_in_doubt_seconds",
            "How long ago the receipt of the oldest call in doubt was last written, 0 when none is in doubt",
        )
        oldest_doubt.add_metric([], _age(oldest_in_doubt(), now))
        yield oldest_doubt

        by_code = dict(
            Finding.objects.filter(closed_at__isnull=True).values_list("code").annotate(n=Count("id")).order_by()
        )
        stale = GaugeMetricFamily("callproof_stale_reservations", "Task reservations past the stale age")
        stale.add_metric([], by_code.get("stale_reservation", 0))
        yield stale
        findings = GaugeMetricFamily("callproof_open_findings", "Open findings, by code", labels=["code", "digest"])
        for code, count in sorted(by_code.items()):
            findings.add_metric([code, "true" if code in DIGEST_CODES else "false"], count)
        yield findings

        last = Run.objects.aggregate(at=Max("imported_at"))["at"]
        last_import = GaugeMetricFamily(
            "callproof_last_import_timestamp_seconds", "When the importer last stored a change, Unix time"
        )
        last_import.add_metric([], _seconds(last))
        yield last_import
        lag = GaugeMetricFamily(
            "callproof_run_import_lag_seconds",
            "For each run that is not finished: how long ago it was last imported (a growing value is an "
            "importer falling behind, or a run that stopped writing)",
            labels=["run_id"],
        )
        for run_id, imported_at in Run.objects.unfinished().values_list("run_id", "imported_at"):
            lag.add_metric([run_id], (now - imported_at).total_seconds() if imported_at else float("nan"))
        yield lag

        up = GaugeMetricFamily(
            "callproof_host_up",
            "1 while a host's importer ships (passes within the silence limit), 0 once silent",
            labels=["host"],
        )
        seen = GaugeMetricFamily(
            "callproof_host_last_seen_timestamp_seconds",
            "When a host's importer last finished a pass, Unix time",
            labels=["host"],
        )
        took = GaugeMetricFamily("callproof_host_pass_seconds", "How long a host's last pass took", labels=["host"])
        owed = GaugeMetricFamily(
            "callproof_decisions_awaiting_delivery", "People's decisions a host has still to write into its runs",
            labels=["host"],
        )  # fmt: skip
        oldest = GaugeMetricFamily(
            "callproof_decision_oldest_undelivered_seconds",
            "How long the oldest decision a host has still to write has waited (0 when none waits)",
            labels=["host"],
        )
        failing = GaugeMetricFamily(
            "callproof_decisions_failing_delivery",
            "Decisions a host has still to write whose last try failed (a full disk, an unwritable folder)",
            labels=["host"],
        )
        refused = CounterMetricFamily(
            "callproof_decisions_refused", "Decisions a host's run directories refused (never written)", labels=["host"]
        )
        info = GaugeMetricFamily(
            "callproof_host_info", "A host's importer version (always 1)", labels=["host", "version"]
        )
        erred = GaugeMetricFamily(
            "callproof_host_last_error_timestamp_seconds",
            "When a host's watch last had a pass fail, Unix time (NaN when never)",
            labels=["host"],
        )
        not_arriving = GaugeMetricFamily(
            "callproof_host_runs_not_arriving",
            "A host's shipped runs that have not arrived for EVIDENCE_SHIP_STUCK_AFTER_SECONDS: the mirror short of "
            "the host's ledger with nothing arriving, or a run its shipper cannot send or the server refuses",
            labels=["host"],
        )
        behind = GaugeMetricFamily(
            "callproof_host_mirror_behind_bytes",
            "What the server's mirror lacks of a host's ledgers, as its shipper last said their sizes",
            labels=["host"],
        )
        push_refused = GaugeMetricFamily(
            "callproof_host_pushes_refused_seconds",
            "How long a host's pushes have all been refused (0 when its last push was taken)",
            labels=["host"],
        )
        clock = GaugeMetricFamily(
            "callproof_host_clock_offset_seconds",
            "A host's clock less the server's, as its shipper's last request measured it (NaN when unknown)",
            labels=["host"],
        )
        lacking = dict(
            ShippedRun.objects.filter(behind_since__isnull=False)
            .values_list("host")
            .annotate(n=Sum(Cast(F("host_ledger_bytes") - F("mirror_ledger_bytes"), FloatField())))
            .order_by()
        )
        for facts in hosts.with_facts(list(Host.objects.filter(watching=True))):
            name = facts.name
            not_arriving.add_metric([name], facts.stall.runs_not_arriving)
            behind.add_metric([name], max(0, lacking.get(facts.host.pk) or 0))
            push_refused.add_metric([name], _age(facts.host.push_refused_since, now))
            offset = facts.host.clock_offset_seconds
            clock.add_metric([name], offset if offset is not None else float("nan"))
            up.add_metric([name], 1.0 if facts.state == hosts.SHIPPING else 0.0)
            seen.add_metric([name], _seconds(facts.host.last_seen_at))
            took.add_metric(
                [name], facts.host.last_pass_seconds if facts.host.last_pass_seconds is not None else float("nan")
            )
            owed.add_metric([name], facts.awaiting_delivery)
            oldest.add_metric([name], facts.oldest_undelivered_seconds)
            failing.add_metric([name], facts.failing_delivery)
            refused.add_metric([name], facts.refused)
            info.add_metric([name, facts.host.version], 1.0)
            erred.add_metric([name], _seconds(facts.host.last_error_at))
        yield from (up, seen, took, owed, oldest, failing, refused, info, erred, not_arriving, behind, push_refused,
                    clock)  # fmt: skip
        yield from self.queue(now)

        confirmations = CounterMetricFamily(
            "callproof_confirmations", "Calls settled by a person, by where they settled it", labels=["via"]
        )
        confirmations.add_metric(["dashboard"], HumanDecision.objects.count())
        confirmations.add_metric(["file"], Confirmation.objects.filter(valid=True).count())
        yield confirmations
        actions = dict(AuditEntry.objects.values_list("action").annotate(n=Count("id")).order_by())
        exports = CounterMetricFamily("callproof_evidence_exports", "Redacted evidence exported")
        exports.add_metric([], actions.get(AuditEntry.EVIDENCE_EXPORTED, 0))
        yield exports
        retention = CounterMetricFamily(
            "callproof_retention_actions", "Retention actions and legal holds, by action", labels=["action"]
        )
        for action in (AuditEntry.BODIES_STRIPPED, AuditEntry.RUN_ARCHIVED, AuditEntry.LEGAL_HOLD_SET,
                       AuditEntry.LEGAL_HOLD_LIFTED):  # fmt: skip
            retention.add_metric([action], actions.get(action, 0))
        yield retention
