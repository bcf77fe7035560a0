"""Retention's plans: what each run's policy says is due (keep, strip the bodies, archive) and why.

The seed's rule: a receipt the ledger still references is replay evidence. It
is never deleted on its own by age; bodies (args, results, payloads) may be
stripped, leaving their digests, and a whole run may be archived. Anything a
person still has to look at keeps the run (evidence/lib/retention_rules.py).
A person's decision restarts the clock.

``plan_runs`` and ``plan_segment`` only plan; evidence/retention/actions.py applies a plan.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator

from django.conf import settings
from django.db.models import Count, Q, Sum
from django.utils.translation import gettext_lazy

from evidence.lib import retention_rules, stats
from evidence.lib.pagination import Segment, every_row
from evidence.lib.retention_rules import Joined, Why, why
from evidence.models import Host, Run

KEEP, STRIP_BODIES, ARCHIVE = "keep", "strip_bodies", "archive"
ACTIONS = (KEEP, STRIP_BODIES, ARCHIVE)


@dataclasses.dataclass(frozen=True)
class RetentionPolicy:
    strip_after: dt.timedelta
    archive_after: dt.timedelta

    @classmethod
    def from_settings(cls) -> RetentionPolicy:
        return cls(
            strip_after=dt.timedelta(days=settings.RETENTION_STRIP_AFTER_DAYS),
            archive_after=dt.timedelta(days=settings.RETENTION_ARCHIVE_AFTER_DAYS),
        )


@dataclasses.dataclass
class RunPlan:
    run_id: str
    action: str  # keep, strip_bodies, archive
    reason: str  # in English, as downloads, the command line and the audit keep it
    blockers: list[str]
    clock_from: dt.datetime | None  # the last event, or a person's later decision
    strip_on: dt.datetime | None
    archive_on: dt.datetime | None
    body_bytes: int  # what stripping the bodies would free in the database
    why: Why | None = None  # ``reason`` for the page, in the reader's language
    why_blocked: list[Why] = dataclasses.field(default_factory=list)  # ``blockers`` for the page

    @property
    def shown_reason(self) -> str:
        return self.why.shown() if self.why else self.reason

    @property
    def shown_blockers(self) -> list[str]:
        return [blocker.shown() for blocker in self.why_blocked] or self.blockers


PLAN_FIELDS = ("run_id", "state", "last_event_at", "activity_at", "archived", "bodies_stripped_at", "summary",
               "legal_hold", "legal_hold_by", "legal_hold_reason", "legal_hold_since")  # fmt: skip


def plan_segment(
    *, policy: RetentionPolicy, now: dt.datetime, action: str = "", blocked: bool = False, host: Host | None = None
) -> Segment:
    """Every run's plan, by run_id, or only those ``action`` takes, or only the ``blocked``, or only
    ``host``'s: the filters are conditions on the facts kept with each run's summary
    (``retention_facts``), so a page of plans reads one page of runs."""
    runs = Run.objects.all() if host is None else Run.objects.filter(host=host)
    if blocked:
        runs = runs.filter(retention_blocked=True)
    if action:
        runs = runs.filter(_due(policy, now)[action])
    return Segment(
        runs.only(*PLAN_FIELDS),
        ("run_id",),
        present=lambda rows: [_plan(run, policy, now, stats.RunSummary.of(run)) for run in rows],
    )


def plan_runs(*, policy: RetentionPolicy, now: dt.datetime, host: Host | None = None) -> Iterator[RunPlan]:
    """Every run's plan, by run_id, or ``host``'s runs' (what ``apply_retention`` acts on)."""
    return every_row(plan_segment(policy=policy, now=now, host=host))


def plan_totals(*, policy: RetentionPolicy, now: dt.datetime) -> dict[str, object]:
    """How many runs each action takes, how many are blocked, and what stripping and archiving
    would free in the database: one query over the runs' kept facts."""
    due = _due(policy, now)
    counts = Run.objects.aggregate(
        **{action: Count("pk", filter=condition) for action, condition in due.items()},
        blocked=Count("pk", filter=Q(retention_blocked=True)),
        freed=Sum("body_bytes", filter=due[STRIP_BODIES] | due[ARCHIVE], default=0),
    )
    return {
        "counts": {action: counts[action] for action in ACTIONS},
        "body_bytes_freed": counts["freed"],
        "blocked": counts["blocked"],
    }


def _due(policy: RetentionPolicy, now: dt.datetime) -> dict[str, Q]:
    """``_plan``'s choice of action, as conditions on the kept facts (a test holds them to it)."""
    movable = Q(archived=False, retention_blocked=False, retention_clock_from__isnull=False)
    archive = movable & Q(retention_clock_from__lte=now - policy.archive_after)
    strip = (
        movable
        & Q(retention_clock_from__lte=now - policy.strip_after, retention_clock_from__gt=now - policy.archive_after)
        & Q(body_bytes__gt=0, bodies_stripped_at__isnull=True)
    )
    keep = (
        Q(archived=True)
        | Q(retention_blocked=True)
        | Q(retention_clock_from__isnull=True)
        | Q(retention_clock_from__gt=now - policy.strip_after)
        | (
            Q(retention_clock_from__gt=now - policy.archive_after)
            & (Q(body_bytes=0) | Q(bodies_stripped_at__isnull=False))
        )
    )
    return {KEEP: keep, STRIP_BODIES: strip, ARCHIVE: archive}


def _plan(run: Run, policy: RetentionPolicy, now: dt.datetime, summary: stats.RunSummary) -> RunPlan:
    blockers = retention_rules.blockers(run, summary)
    clock_from = retention_rules.clock_from(run, summary)
    strip_on = clock_from + policy.strip_after if clock_from else None
    archive_on = clock_from + policy.archive_after if clock_from else None
    body_bytes = summary.body_bytes
    if run.archived:
        action, reason = KEEP, why(gettext_lazy("archived already: its rows stay browsable"))
    elif blockers:
        action, reason = KEEP, why(gettext_lazy("kept: %(blockers)s"), blockers=Joined(blockers))
    elif clock_from is None:
        action, reason = KEEP, why(gettext_lazy("no event yet: the clock has not started"))
    else:
        action, reason = _clock_action(run, policy, now, clock_from, body_bytes)
    english = [str(blocker) for blocker in blockers]
    return RunPlan(run.run_id, action, str(reason), english, clock_from, strip_on, archive_on, body_bytes,
                   reason, blockers)  # fmt: skip


def _clock_action(
    run: Run, policy: RetentionPolicy, now: dt.datetime, clock_from: dt.datetime, body_bytes: int
) -> tuple[str, Why]:
    """(action, reason) for a run that nothing keeps, whose clock started at ``clock_from``."""
    strip_on, archive_on = clock_from + policy.strip_after, clock_from + policy.archive_after
    since = gettext_lazy("%(days)s days since %(time)s")
    if now >= archive_on:
        return ARCHIVE, why(since, days=policy.archive_after.days, time=clock_from)
    if now >= strip_on and body_bytes and run.bodies_stripped_at is None:
        return STRIP_BODIES, why(since, days=policy.strip_after.days, time=clock_from)
    due = archive_on if now >= strip_on else strip_on
    return KEEP, why(gettext_lazy("nothing is due before %(time)s"), time=due)


def replanned(run_id: str, policy: RetentionPolicy, now: dt.datetime) -> tuple[Run, RunPlan]:
    """The run and its plan as they are now, its row locked until the caller's transaction
    ends: what retention acts on is re-checked at the moment it acts (a legal hold set, a call
    found in doubt since the plan was made)."""
    run = Run.objects.select_for_update(of=("self",)).select_related("host").get(run_id=run_id)
    return run, _plan(run, policy, now, stats.RunSummary.of(run))
