"""Each rule is written once, and everything that asks it gets the same answer.

"In doubt" is the call's recovery decision (``protocol.in_doubt``): the writer's
gate (``runs.unsettled_calls``, ``runtime.call_in_doubt``), the dashboard's rows
(``Call.in_doubt``), the inbox, the run's stored counts, settling and /metrics
are checked against each other over every call of the demo and of runs made to
hold the odd cases (a legacy "failed" receipt, a commit its target does not show,
a receipt gone from under its ledger). "Finished" is ``protocol.run_is_finished``:
the pages, retention and /metrics over runs in every finished state and a few
that are not.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from http import HTTPStatus
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from evidence.ingest import importer
from evidence.lib import stats
from evidence.models import Call, Run
from evidence.retention import plans
from evidence.review import inbox, settle
from receipts import protocol, runtime
from receipts.runs import unsettled_calls
from tests.helpers import CONTRACT, PROJECT, import_as_seen_later, join
from tests.test_operations import scrape
from tests.writer import MESSAGE, cli_call, edit_receipt, output

pytestmark = pytest.mark.django_db


def _legacy_failed(run_dir: Path) -> str:
    """A receipt of the format's first version, whose status cannot tell retryable from permanent."""
    outcome = runtime.Executor(run_dir).call("write_file", {"path": "old.txt", "content": "x"}, attempt=1)
    edit_receipt(run_dir, outcome.call_id, lambda receipt: receipt.update(status="failed", result=None))
    return outcome.call_id


def _disputed(run_dir: Path) -> str:
    call_id = output(cli_call(run_dir, "send_message", MESSAGE))["call_id"]
    (run_dir / "outbox.jsonl").write_bytes(b"")  # the message's line is gone from its target
    assert cli_call(run_dir, "send_message", MESSAGE).returncode == 4
    return call_id


def _receipt_gone(run_dir: Path) -> str:
    outcome = runtime.Executor(run_dir).call("write_file", {"path": "gone.txt", "content": "x"}, attempt=1)
    (run_dir / "receipts" / f"{outcome.call_id}.json").unlink()
    return outcome.call_id


ODD_CASES = {"legacy-failed": _legacy_failed, "disputed-commit": _disputed, "receipt-gone": _receipt_gone}


@pytest.fixture
def odd_cases(demo_root) -> dict[str, str]:
    """The demo runs, and one run for each odd case; the call_id of each odd call."""
    made = {}
    for run_id, make in ODD_CASES.items():
        run_dir = demo_root / run_id
        runtime.run_init(run_dir, contract_sha256=CONTRACT)
        made[run_id] = make(run_dir)
    import_as_seen_later(demo_root)
    return made


def test_the_writer_and_every_page_agree_on_which_calls_are_in_doubt(odd_cases, client):
    in_the_inbox = {(item.run_id, item.subject) for item in inbox.inbox_items()
                    if item.kind in (inbox.IN_DOUBT, inbox.TAMPERED, inbox.DISPUTED)}  # fmt: skip
    every_in_doubt = set()
    for run in Run.objects.all():
        writer_says = {call_id for call_id, _ in unsettled_calls(Path(run.path))}
        rows_say = set(run.calls.in_doubt().values_list("call_id", flat=True))
        assert rows_say == writer_says, run.run_id
        assert {call.call_id for call in run.calls.all() if call.in_doubt} == rows_say, run.run_id
        assert stats.RunSummary.of(run).in_doubt == len(rows_say), run.run_id
        assert {subject for run_id, subject in in_the_inbox if run_id == run.run_id} == rows_say, run.run_id
        for call in run.calls.all():
            assert settle.may_be_settled(call) == (call.call_id in rows_say and call.receipt_present)
            if call.receipt_present:
                receipt = (Path(run.path) / "receipts" / f"{call.call_id}.json").read_bytes()
                assert runtime.call_in_doubt(Path(run.path), call.call_id, receipt) == (call.call_id in rows_say)
        every_in_doubt |= {(run.run_id, call_id) for call_id in rows_say}
    assert every_in_doubt == in_the_inbox
    assert {(run_id, call_id) for run_id, call_id in odd_cases.items()} <= every_in_doubt, "each odd case is in doubt"
    assert ("tampered-receipt", Call.objects.get(run__run_id="tampered-receipt").call_id) in every_in_doubt
    assert scrape(client)[("callproof_calls_in_doubt", ())] == len(every_in_doubt)
    assert inbox.inbox_total() == len(every_in_doubt) + sum(
        1 for item in inbox.inbox_items() if item.kind not in (inbox.IN_DOUBT, inbox.TAMPERED, inbox.DISPUTED)
    )


def test_a_legacy_failed_receipt_is_settled_like_any_call_in_doubt(odd_cases):
    """Its recovery decision always asked a person; now a person can answer, and the runtime follows."""
    run = Run.objects.get(run_id="legacy-failed")
    call = Call.objects.get(run=run, call_id=odd_cases["legacy-failed"])
    person = join(get_user_model().objects.create_user("carol"), "confirmer")
    settle.settle_call(run=run, call=call, user=person, resolution="rejected", reason="the file is not there",
                       typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256,
                       confirm_against_evidence=True)  # fmt: skip
    call.refresh_from_db()
    assert not call.in_doubt and call.decision == "retry"
    assert odd_cases["legacy-failed"] not in {call_id for call_id, _ in unsettled_calls(Path(run.path))}


def test_a_call_that_is_not_in_doubt_is_refused_with_its_decision(demo):
    call = Call.objects.filter(run__run_id="clean-run").first()
    assert call is not None
    person = join(get_user_model().objects.create_user("carol"), "confirmer")
    with pytest.raises(settle.SettleError) as refused:
        settle.settle_call(run=call.run, call=call, user=person, resolution="rejected", reason="no",
                           typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256)  # fmt: skip
    assert refused.value.status == HTTPStatus.CONFLICT and refused.value.code == settle.NOT_IN_DOUBT
    assert refused.value.values == {"reason": call.decision_reason}


NOT_FINISHED = ("running", "retrying", "paused", "Finished", "done")


@pytest.mark.parametrize("state", [*protocol.FINISHED_STATES, *NOT_FINISHED])
def test_finished_means_the_same_to_the_pages_retention_and_metrics(run_dir, client, state):
    runtime.Executor(run_dir).call("write_file", {"path": "a.txt", "content": "x"})
    runtime.run_set_state(run_dir, state=state, attempts=1)
    importer.run_import(path=run_dir)
    run = Run.objects.get(run_id=run_dir.name)
    finished = protocol.run_is_finished(state)
    assert finished == (state in protocol.FINISHED_STATES)
    assert run.is_finished == finished
    assert Run.objects.unfinished().filter(pk=run.pk).exists() == (not finished)
    later = protocol.utc_now() + dt.timedelta(days=400)
    policy = plans.RetentionPolicy.from_settings()
    [plan] = [plan for plan in plans.plan_runs(policy=policy, now=later) if plan.run_id == run.run_id]
    assert (plan.action == plans.ARCHIVE) == finished, plan.blockers
    due = plans.plan_segment(policy=policy, now=later, action=plans.ARCHIVE).rows
    assert due.filter(pk=run.pk).exists() == finished, "the kept facts say what the plan says"
    assert any(blocker.startswith("unfinished") for blocker in plan.blockers) == (not finished)
    watched = {labels for name, labels in scrape(client) if name == "callproof_run_import_lag_seconds"}
    assert ((("run_id", run.run_id),) in watched) == (not finished)


def test_the_retired_finished_states_setting_stops_start_up_with_its_reason():
    env = {**os.environ, "DJANGO_DEBUG": "1", "EVIDENCE_FINISHED_STATES": "finished,done"}
    completed = subprocess.run([sys.executable, "-c", "import evidence.settings"], cwd=PROJECT, env=env,
                               capture_output=True, text=True, check=False)  # fmt: skip
    assert completed.returncode != 0
    assert "EVIDENCE_FINISHED_STATES is no longer read" in completed.stderr
    assert ", ".join(protocol.FINISHED_STATES) in completed.stderr
