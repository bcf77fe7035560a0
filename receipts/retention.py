"""Retention: what each run's policy says is due, and what keeps a run whatever its age.

The seed's rule: a receipt the ledger still references is replay evidence. It
is never deleted on its own by age; bodies (args, results, payloads) may be
stripped, leaving their digests, and a whole run may be archived. Anything a
person still has to look at keeps the run: a call in doubt, a stale
reservation or an open conflict, an unfinished run, an open digest mismatch,
tampering or rewritten ledger. A person's decision restarts the clock.

This module plans; nothing here changes a file or a row.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict

from django.conf import settings
from django.db.models import Count, Max, Sum
from django.db.models.functions import Coalesce, Length

from receipts import protocol
from receipts.findings import DIGEST_CODES
from receipts.models import Call, Confirmation, Finding, HumanDecision, Run

KEEP, STRIP_BODIES, ARCHIVE = "keep", "strip_bodies", "archive"
ACTIONS = (KEEP, STRIP_BODIES, ARCHIVE)
UNSETTLED = ("confirm", "query")


@dataclasses.dataclass(frozen=True)
class RetentionPolicy:
    strip_after: dt.timedelta
    archive_after: dt.timedelta
    finished_states: tuple[str, ...]

    @classmethod
    def from_settings(cls) -> RetentionPolicy:
        return cls(
            strip_after=dt.timedelta(days=settings.RETENTION_STRIP_AFTER_DAYS),
            archive_after=dt.timedelta(days=settings.RETENTION_ARCHIVE_AFTER_DAYS),
            finished_states=tuple(settings.RETENTION_FINISHED_STATES),
        )


@dataclasses.dataclass
class RunPlan:
    run_id: str
    action: str  # keep, strip_bodies, archive
    reason: str
    blockers: list[str]
    clock_from: dt.datetime | None  # the last event, or a person's later decision
    strip_on: dt.datetime | None
    archive_on: dt.datetime | None
    body_bytes: int  # what stripping the bodies would free in the database


def plan_runs(*, policy: RetentionPolicy, now: dt.datetime, runs=None) -> list[RunPlan]:
    """The plan of every run (or of ``runs``), in a fixed number of queries."""
    runs = list(runs if runs is not None else Run.objects.order_by("run_id"))
    ids = [run.pk for run in runs]
    in_doubt = dict(
        Call.objects.filter(run_id__in=ids, status__in=protocol.IN_DOUBT_STATUSES, decision__in=UNSETTLED)
        .values_list("run_id")
        .annotate(n=Count("id"))
    )
    findings: dict[int, dict[str, int]] = defaultdict(dict)
    for run_id, code, count in (
        Finding.objects.filter(run_id__in=ids, closed_at__isnull=True)
        .values_list("run_id", "code")
        .annotate(n=Count("id"))
    ):
        findings[run_id][code] = count
    # A person's decision restarts the clock: the run still matters to someone.
    confirmed = Confirmation.objects.filter(run_id__in=ids).values_list("run_id").annotate(m=Max("confirmed_at"))
    attention = dict(confirmed)
    decided = HumanDecision.objects.filter(run_id__in=ids).values_list("run_id").annotate(m=Max("decided_at"))
    for run_id, moment in decided:
        attention[run_id] = max(filter(None, (attention.get(run_id), moment)))
    bodies = dict(
        Call.objects.filter(run_id__in=ids)
        .values_list("run_id")
        .annotate(n=Sum(Coalesce(Length("args"), 0) + Coalesce(Length("result"), 0) + Coalesce(Length("error"), 0)))
    )
    return [
        _plan(run, policy, now, in_doubt.get(run.pk, 0), findings.get(run.pk, {}), attention.get(run.pk), bodies)
        for run in runs
    ]


def _blockers(run: Run, policy: RetentionPolicy, in_doubt: int, codes: dict[str, int]) -> list[str]:
    blockers = []
    if run.state.lower() not in policy.finished_states:
        blockers.append(f"unfinished (state {run.state or 'none'})")
    if in_doubt:
        blockers.append(f"{in_doubt} call{'s' if in_doubt > 1 else ''} in doubt, not yet settled")
    if codes.get("stale_reservation"):
        blockers.append("a stale reservation")
    if codes.get("submission_conflict"):
        blockers.append("an open submission conflict")
    mismatches = sorted(code for code in codes if code in DIGEST_CODES)
    if mismatches:
        blockers.append(f"open {', '.join(mismatches)}")
    return blockers


def _plan(run, policy, now, in_doubt, codes, attended, bodies) -> RunPlan:
    blockers = _blockers(run, policy, in_doubt, codes)
    clock_from = max(filter(None, (run.last_event_at, attended)), default=None)
    strip_on = clock_from + policy.strip_after if clock_from else None
    archive_on = clock_from + policy.archive_after if clock_from else None
    body_bytes = bodies.get(run.pk) or 0
    if run.archived:
        action, reason = KEEP, "archived already: its rows stay browsable"
    elif blockers:
        action, reason = KEEP, "kept: " + "; ".join(blockers)
    elif clock_from is None:
        action, reason = KEEP, "no event yet: the clock has not started"
    elif now >= archive_on:
        action, reason = ARCHIVE, f"{policy.archive_after.days} days since {protocol.format_time(clock_from)}"
    elif now >= strip_on and body_bytes:
        action, reason = STRIP_BODIES, f"{policy.strip_after.days} days since {protocol.format_time(clock_from)}"
    else:
        due = archive_on if now >= strip_on else strip_on
        action, reason = KEEP, f"nothing is due before {protocol.format_time(due)}"
    return RunPlan(run.run_id, action, reason, blockers, clock_from, strip_on, archive_on, body_bytes)


def plan_totals(plans: list[RunPlan]) -> dict[str, object]:
    """How many runs each action takes, and what stripping and archiving would free in the database."""
    counts = {action: sum(plan.action == action for plan in plans) for action in ACTIONS}
    freed = sum(plan.body_bytes for plan in plans if plan.action in (STRIP_BODIES, ARCHIVE))
    return {"counts": counts, "body_bytes_freed": freed, "blocked": sum(bool(plan.blockers) for plan in plans)}
