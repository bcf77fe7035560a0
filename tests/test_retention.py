"""Retention planning: every blocker keeps its run, the clock, the page and the plan command."""

from __future__ import annotations

import datetime as dt
import json
from io import StringIO

import pytest
from django.core.management import call_command

from evidence.lib import stats
from evidence.models import Call, HumanDecision, Run
from evidence.retention import actions, plans
from receipts import protocol
from tests.helpers import content, first_call_of

pytestmark = pytest.mark.django_db

POLICY = plans.RetentionPolicy(
    strip_after=dt.timedelta(days=30),
    archive_after=dt.timedelta(days=365),
)


def plans_at(days: int) -> dict[str, plans.RunPlan]:
    now = protocol.utc_now() + dt.timedelta(days=days)
    return {plan.run_id: plan for plan in plans.plan_runs(policy=POLICY, now=now)}


def test_each_blocker_keeps_its_run_whatever_its_age(demo):
    every_plan = plans_at(10_000)
    assert every_plan["send-message-killed"].action == "keep"
    assert "unfinished (state running)" in every_plan["send-message-killed"].blockers
    assert "1 call in doubt, not yet settled" in every_plan["send-message-killed"].blockers
    assert "a stale reservation" in every_plan["stale-reservation"].blockers
    assert "an open submission conflict" in every_plan["conflict-same-id"].blockers
    assert "open identity_mismatch, input_digest_mismatch" in every_plan["tampered-receipt"].blockers
    for run_id in ("send-message-killed", "stale-reservation", "conflict-same-id", "tampered-receipt"):
        assert every_plan[run_id].action == "keep", run_id


def test_a_finished_clean_run_is_stripped_then_archived_on_its_dates(demo):
    assert plans_at(10)["clean-run"].action == "keep"
    assert "nothing is due before" in plans_at(10)["clean-run"].reason
    stripped = plans_at(31)["clean-run"]
    assert stripped.action == "strip_bodies" and stripped.body_bytes > 0
    assert plans_at(366)["clean-run"].action == "archive"
    run = Run.objects.get(run_id="clean-run")
    assert run.last_event_at is not None
    assert stripped.strip_on == run.last_event_at + dt.timedelta(days=30)
    assert stripped.archive_on == run.last_event_at + dt.timedelta(days=365)


def test_a_runs_without_bodies_has_nothing_to_strip(demo):
    assert plans_at(31)["a4-concurrent"].action == "keep", "no call: no body to strip"
    assert plans_at(366)["a4-concurrent"].action == "archive"


def test_a_persons_decision_restarts_the_clock(demo, user):
    call = first_call_of("clean-run")
    last_event_at = Run.objects.get(run_id="clean-run").last_event_at
    assert last_event_at is not None
    later = last_event_at + dt.timedelta(days=20)
    HumanDecision.objects.create(
        run=call.run, call_id=call.call_id, resolution="committed", reason="looked again", user=user, actor="alice",
        decided_at=later, receipt_sha256=call.file_sha256, confirmation_id="c" * 64,
    )  # fmt: skip
    stats.refresh_run_summary(call.run)  # as settling does
    assert plans_at(31)["clean-run"].action == "keep"
    assert plans_at(31)["clean-run"].strip_on == later + dt.timedelta(days=30)


def test_the_plan_command_prints_the_interface_and_changes_nothing(demo):
    before = sorted((path.relative_to(demo), path.stat().st_mtime_ns) for path in demo.rglob("*"))
    calls_before = list(Call.objects.order_by("pk").values_list("pk", "args", "result", "decision"))
    out = StringIO()
    call_command("apply_retention", "--json", stdout=out)
    document = json.loads(out.getvalue())
    assert {tuple(sorted(run)) for run in document["runs"]} == {("action", "blockers", "reason", "run_id")}
    assert {run["run_id"] for run in document["runs"]} == set(Run.objects.values_list("run_id", flat=True))
    assert sorted((path.relative_to(demo), path.stat().st_mtime_ns) for path in demo.rglob("*")) == before
    assert list(Call.objects.order_by("pk").values_list("pk", "args", "result", "decision")) == calls_before


def test_the_retention_page_shows_plans_totals_filters_and_twins(logged_in, demo):
    page = content(logged_in.get("/retention/"))
    assert "Retention" in page and "a stale reservation" in page and "stripping and archiving would free" in page
    blocked = content(logged_in.get("/retention/?blocked=1"))
    assert "clean-run</a>" not in blocked and "tampered-receipt</a>" in blocked
    items = json.loads(content(logged_in.get("/retention/?format=json&action=keep")))["items"]
    assert {item["action"] for item in items} == {"keep"} and len(items) == Run.objects.count()
    assert logged_in.get("/retention/?action=delete").status_code == 400


def hold(client, run_id: str, **data: str):
    return client.post(f"/runs/{run_id}/hold/", data)


def test_a_legal_hold_is_set_and_lifted_with_a_reason_audited_and_it_keeps_the_run(client, demo, user):
    from http import HTTPStatus

    from django.contrib.auth.models import Permission

    from evidence.models import AuditEntry

    client.force_login(user)
    old = protocol.utc_now() - dt.timedelta(days=100)
    Run.objects.filter(run_id="clean-run").update(last_event_at=old, activity_at=old)
    assert plans_at(0)["clean-run"].action == "strip_bodies", "100 days old: its bodies are due"
    assert hold(client, "clean-run", hold="set", reason="litigation").status_code == HTTPStatus.FORBIDDEN
    user.user_permissions.add(Permission.objects.get(codename="set_legal_hold"))
    assert client.get("/runs/clean-run/hold/").status_code == HTTPStatus.METHOD_NOT_ALLOWED
    assert hold(client, "clean-run", hold="set", reason="   ").status_code == HTTPStatus.SEE_OTHER
    assert not Run.objects.get(run_id="clean-run").legal_hold, "a hold needs a reason"
    assert hold(client, "clean-run", hold="maybe", reason="x").status_code == HTTPStatus.BAD_REQUEST
    assert hold(client, "clean-run", reason="x").status_code == HTTPStatus.BAD_REQUEST, "hold is required"
    assert hold(client, "clean-run", hold="set", reason="litigation 2026-17").status_code == HTTPStatus.SEE_OTHER
    run = Run.objects.get(run_id="clean-run")
    assert (run.legal_hold, run.legal_hold_reason, run.legal_hold_by) == (True, "litigation 2026-17", "alice")
    assert 'held</strong> by <span translate="no">alice</span>' in content(client.get("/runs/clean-run/"))
    plan = plans_at(10_000)["clean-run"]
    assert plan.action == "keep" and "a legal hold (alice: litigation 2026-17)" in plan.blockers
    assert hold(client, "clean-run", hold="lift", reason="case closed").status_code == HTTPStatus.SEE_OTHER
    assert not Run.objects.get(run_id="clean-run").legal_hold
    assert plans_at(0)["clean-run"].action == "keep", "the hold and its lifting restarted the clock"
    assert list(AuditEntry.objects.order_by("at").values_list("action", "actor", "reason")) == [
        ("legal_hold_set", "alice", "litigation 2026-17"),
        ("legal_hold_lifted", "alice", "case closed"),
    ]
    page = content(client.get("/audit/"))
    assert "Legal holds, retention, exports, triage and people's accounts" in page and "case closed" in page


def test_applying_retention_is_audited(demo, monkeypatch, settings, tmp_path):
    from evidence.models import AuditEntry

    monkeypatch.setenv("RECEIPTS_CLOCK", "2036-01-01T00:00:00Z")
    settings.EVIDENCE_ARCHIVE_ROOT = tmp_path / "archive"
    call_command("apply_retention", "--apply", stdout=StringIO())
    actions = set(AuditEntry.objects.filter(run__run_id="clean-run").values_list("action", "actor"))
    assert actions == {("bodies_stripped", "apply_retention"), ("run_archived", "apply_retention")}
    call_command("apply_retention", "--apply", stdout=StringIO())
    assert AuditEntry.objects.filter(run__run_id="clean-run").count() == 2, "nothing done twice, nothing logged twice"


@pytest.mark.parametrize("days", [0, 29, 31, 364, 366, 10_000])
def test_the_facts_kept_with_each_run_choose_what_its_plan_chooses(demo, user, days):
    """The page filters, pages and totals on columns kept at import (``retention_facts``), not
    by planning every run: over the demo, a stripped run and a held one, at every age, the
    conditions pick exactly the runs the plan picks."""
    Run.objects.filter(run_id="a2-lost-response").update(bodies_stripped_at=protocol.utc_now())
    actions.set_legal_hold(run=Run.objects.get(run_id="a4-concurrent"), user=user, hold=True, reason="a case",
                             now=protocol.utc_now())  # fmt: skip
    now = protocol.utc_now() + dt.timedelta(days=days)
    every_plan = list(plans.plan_runs(policy=POLICY, now=now))
    assert len(every_plan) == Run.objects.count()
    for action in plans.ACTIONS:
        chosen = plans.plan_segment(policy=POLICY, now=now, action=action).rows.values_list("run_id", flat=True)
        assert set(chosen) == {plan.run_id for plan in every_plan if plan.action == action}, action
    blocked = plans.plan_segment(policy=POLICY, now=now, blocked=True).rows.values_list("run_id", flat=True)
    assert set(blocked) == {plan.run_id for plan in every_plan if plan.blockers}
    totals = plans.plan_totals(policy=POLICY, now=now)
    assert totals["counts"] == {action: sum(plan.action == action for plan in every_plan) for action in plans.ACTIONS}
    assert totals["blocked"] == sum(bool(plan.blockers) for plan in every_plan)
    freed = sum(plan.body_bytes for plan in every_plan if plan.action in (plans.STRIP_BODIES, plans.ARCHIVE))
    assert totals["body_bytes_freed"] == freed
    if days in (31, 366):
        assert totals["counts"][plans.STRIP_BODIES if days == 31 else plans.ARCHIVE] > 0, "the ages matter"
