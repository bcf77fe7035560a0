"""A run's counts, kept at import time so that no page counts over a million rows.

Two kinds, each kept where it changes:

- the ledger's: events by type and events per minute (``EventTally``), added
  to batch by batch in the transaction that stores the batch's events and its
  cursor, so they can never disagree with the events stored;
- the files': calls by shown status, calls in doubt, findings by code,
  decisions and submissions (``Run.summary``), counted again over the run's
  own rows (index-backed, grouped) after each import that changed something
  and after a person settles a call.

Pages read both as stored; ``RunSummary`` is what they see.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from typing import Any

from django.db import connection
from django.db.models import Count, Max, Sum
from django.db.models.functions import Coalesce, Length

from evidence.lib import hosts, retention_rules
from evidence.lib.minutes import EPOCH, minute_of  # noqa: F401 - where pages and migrations find them
from evidence.models import EventTally, Run
from receipts import protocol, recovery
from receipts.findings import DIGEST_CODES


def count_batch(run: Run, types: Counter[str], minutes: Counter[int], *, restarted: bool) -> None:
    """Add one ledger batch's counts, events by type and by minute (``read_ahead.prepare_batch``),
    to the run's (inside the batch's transaction).

    ``restarted``: the ledger was rewritten and its events deleted; so are the counts.
    """
    stored = Run.objects.filter(pk=run.pk).values_list("event_type_counts", flat=True).get()
    if restarted:
        stored = {}
        EventTally.objects.filter(run=run).delete()
    for name, count in types.items():
        stored[name] = stored.get(name, 0) + count
    Run.objects.filter(pk=run.pk).update(event_type_counts=stored)
    run.event_type_counts = stored
    if not minutes:
        return
    quote = connection.ops.quote_name
    table = quote(EventTally._meta.db_table)
    # An existing minute is added to, never replaced: one statement, on both databases.
    sql = (
        f"INSERT INTO {table} (run_id, minute, count) VALUES (%s, %s, %s) "  # noqa: S608 - names from the model
        f"ON CONFLICT (run_id, minute) DO UPDATE SET count = {table}.count + excluded.count"
    )
    with connection.cursor() as cursor:
        cursor.executemany(sql, [(run.pk, minute, count) for minute, count in sorted(minutes.items())])


@dataclasses.dataclass
class RunSummary:
    """What the runs list, the run page, retention and the evidence say of a run first."""

    calls_by_status: dict[str, int] = dataclasses.field(default_factory=dict)  # as shown: see Call.shown_status
    in_doubt: int = 0  # calls whose recovery decision waits for the target or a person (Call.in_doubt)
    # The same calls by what they wait for (``need_of``): the run page's first lines.
    in_doubt_by_need: dict[str, int] = dataclasses.field(default_factory=dict)
    findings_by_code: dict[str, int] = dataclasses.field(default_factory=dict)  # open findings
    decisions: dict[str, int] = dataclasses.field(default_factory=dict)
    submissions: int = 0
    body_bytes: int = 0  # the JSON text of args, results and errors: what stripping frees
    last_decision_at: dt.datetime | None = None  # the latest confirmation or dashboard decision

    @classmethod
    def of(cls, run: Any) -> RunSummary:
        """The summary stored on ``run`` (an empty one before its first import)."""
        stored = run.summary or {}
        summary = cls(**{name: value for name, value in stored.items() if name in SUMMARY_FIELDS})
        if isinstance(summary.last_decision_at, str):
            summary.last_decision_at = protocol.parse_time(summary.last_decision_at)
        return summary

    def as_stored(self) -> dict[str, Any]:
        stored = dataclasses.asdict(self)
        if self.last_decision_at is not None:
            stored["last_decision_at"] = protocol.format_time(self.last_decision_at)
        return stored

    @property
    def calls(self) -> int:
        return sum(self.calls_by_status.values())

    @property
    def open_findings(self) -> int:
        return sum(self.findings_by_code.values())

    @property
    def stale_reservations(self) -> int:
        return self.findings_by_code.get("stale_reservation", 0)

    @property
    def finding_codes(self) -> set[str]:
        return set(self.findings_by_code)

    @property
    def needs_attention(self) -> bool:
        return bool(self.in_doubt or self.open_findings)

    @property
    def verdict(self) -> str:
        """ok, in doubt, tampered or conflict: what a person should know of the run first."""
        if self.calls_by_status.get("tampered") or self.finding_codes & set(DIGEST_CODES):
            return "tampered"
        if "submission_conflict" in self.finding_codes:
            return "conflict"
        if self.in_doubt or self.stale_reservations:
            return "in doubt"
        return "ok"


# What a call in doubt waits for: a receipt that fails its check or is missing, investigated
# first; a query of its target, which a resume makes; a person.
INVESTIGATE = ("tampered", "unverified", "disputed", "missing")
NEEDS = (*INVESTIGATE, "confirm", "query")  # most serious first


def need_of(*, present: bool, verification: str, decision: str) -> str:
    """What a call in doubt waits for (one of ``NEEDS``): what its receipt's check said, else
    its decision. A call shows as in doubt, disputed or tampered (``receipts.states``); this
    says why, for the run page's lines."""
    if not present:
        return "missing"
    if verification in protocol.SHOWN_FOR_VERDICT:
        return protocol.SHOWN_FOR_VERDICT[verification]
    return "query" if decision == "query" else "confirm"


SUMMARY_FIELDS = frozenset(field.name for field in dataclasses.fields(RunSummary))


def refresh_run_summary(run: Run, apps: Any = None) -> RunSummary:
    """Count the run's calls, findings, submissions and decisions again and store the result:
    grouped queries over this run's own rows, made when they change, never by a page.

    ``apps``: a migration's historical models (the migration that added the summary fills it).
    """
    if apps is not None:
        names = ("Call", "Confirmation", "Finding", "HumanDecision", "Run", "Submission")
        Call, Confirmation, Finding, HumanDecision, Run, Submission = (apps.get_model("receipts", n) for n in names)  # noqa: N806
    else:
        from evidence.models import Call, Confirmation, Finding, HumanDecision, Run, Submission
    summary = RunSummary()
    body = Coalesce(Length("args"), 0) + Coalesce(Length("result"), 0) + Coalesce(Length("error"), 0)
    calls = (
        Call.objects.filter(run=run)
        .values_list("status", "verification", "decision", "receipt_present")
        .annotate(n=Count("id"), bytes=Sum(body))
        .order_by()
    )
    for status, verification, decision, present, count, body_bytes in calls:
        shown = recovery.shown_status(present=present, status=status, verification=verification, decision=decision)
        summary.calls_by_status[shown] = summary.calls_by_status.get(shown, 0) + count
        if protocol.in_doubt(decision):
            summary.in_doubt += count
            need = need_of(present=present, verification=verification, decision=decision)
            summary.in_doubt_by_need[need] = summary.in_doubt_by_need.get(need, 0) + count
        if decision:
            summary.decisions[decision] = summary.decisions.get(decision, 0) + count
        summary.body_bytes += body_bytes or 0
    findings = Finding.objects.filter(run=run, closed_at__isnull=True).values_list("code").annotate(n=Count("id"))
    summary.findings_by_code = dict(sorted(findings.order_by()))
    summary.submissions = Submission.objects.filter(run=run).count()
    # A person's decision restarts retention's clock: the run still matters to someone.
    moments = (
        Confirmation.objects.filter(run=run).aggregate(m=Max("confirmed_at"))["m"],
        HumanDecision.objects.filter(run=run).aggregate(m=Max("decided_at"))["m"],
    )
    summary.last_decision_at = max(filter(None, moments), default=None)
    facts = {"summary": summary.as_stored(), "needs_attention": summary.needs_attention}
    facts["body_bytes"] = summary.body_bytes
    # An older migration's models lack the columns added since: each migration keeps what it has.
    known = {field.name for field in Run._meta.get_fields()} | {field.attname for field in Run._meta.concrete_fields}
    run_facts = Run.objects.filter(pk=run.pk).values(*(name for name in RUN_FACTS if name in known)).get()
    if "activity_at" in known:
        run_facts["activity_at"] = facts["activity_at"] = hosts.checked_activity(
            host_id=run_facts["host_id"], run_id=run_facts["run_id"], host_time=run_facts["last_event_at"]
        )
    facts |= retention_rules.retention_facts(run_facts, summary)
    facts = {name: value for name, value in facts.items() if name in known}
    Run.objects.filter(pk=run.pk).update(**facts)
    for name, value in facts.items():
        setattr(run, name, value)
    return summary


# What retention's rules read of a run beside its summary.
RUN_FACTS = ("run_id", "host_id", "state", "last_event_at", "legal_hold", "legal_hold_by", "legal_hold_reason",
             "legal_hold_since")  # fmt: skip
