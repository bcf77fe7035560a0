"""The selectors the pages read through: plain data, no URLs, a fixed number of queries."""

from __future__ import annotations

from collections import Counter

import pytest

from evidence.lib import stats
from evidence.models import Call, Event, Finding, Run
from evidence.review import selectors
from receipts import protocol
from tests.helpers import first_call_of

pytestmark = pytest.mark.django_db


def test_runs_needing_attention_are_those_with_open_findings_or_calls_in_doubt(demo):
    attention = set(selectors.runs_list(attention=True).values_list("run_id", flat=True))
    expected = {
        run.run_id
        for run in Run.objects.all()
        if run.findings.filter(closed_at__isnull=True).exists() or run.calls.in_doubt().exists()
    }
    assert attention == expected and "tampered-receipt" in attention and "clean-run" not in attention
    facets = selectors.run_facets()
    assert (facets.runs, facets.attention) == (Run.objects.count(), len(expected))
    assert facets.states == sorted(set(Run.objects.values_list("state", flat=True)))
    assert facets.total(state="finished", attention=True) == len(
        [run for run in Run.objects.filter(state="finished") if run.run_id in expected]
    )


def test_run_summaries_are_the_counts_stored_at_import(demo, django_assert_num_queries):
    runs = list(Run.objects.all())
    with django_assert_num_queries(0):
        summaries = selectors.run_summaries(runs=runs)
    for run in runs:
        calls = list(run.calls.all())
        assert summaries[run.pk].calls_by_status == dict(Counter(call.shown_status for call in calls)), run.run_id
        assert summaries[run.pk].open_findings == run.findings.filter(closed_at__isnull=True).count(), run.run_id
    clean = summaries[Run.objects.get(run_id="clean-run").pk]
    assert clean.calls_by_status == {"committed": 3} and clean.open_findings == 0
    stale = summaries[Run.objects.get(run_id="stale-reservation").pk]
    assert stale.stale_reservations == 1


def test_search_names_what_it_found_and_builds_no_url(demo):
    call = first_call_of("write-file-killed")
    [run] = selectors.search(query="clean-run")
    # What a record holds is data, out of any translator's reach (docs/glossary.md).
    label = 'run <span translate="no">clean-run</span> (finished, 10 events)'
    assert run == selectors.Target("run", "clean-run", label=label)
    assert {t.run_id for t in selectors.search(query="KILLED")} == {"send-message-killed", "write-file-killed"}
    [upper] = selectors.search(query=first_call_of("write-file-killed").call_id[:8].upper())
    assert upper.kind == "call" and upper.run_id == "write-file-killed"
    tasks = selectors.search(query="task-000001")
    assert {t.kind for t in tasks} == {"submission"} and "a2-lost-response" in {t.run_id for t in tasks}
    shown = '→ <span translate="no">TASK-000001</span> (committed) in <span translate="no">a2-lost-response</span>'
    assert any(shown in t.label for t in tasks)
    [found] = selectors.search(query=call.call_id[:8])
    assert (found.kind, found.run_id, found.key) == ("call", "write-file-killed", call.call_id)
    [submission] = selectors.search(query="a2-submission")
    assert (submission.kind, submission.run_id, submission.key) == ("submission", "a2-lost-response", "a2-submission")
    assert selectors.search(query="  ") == [] and selectors.search(query="zzz-nothing") == []


def test_call_identity_is_the_protocols_check_over_the_imported_receipt(demo):
    run = Run.objects.get(run_id="tampered-receipt")
    tampered = first_call_of("tampered-receipt")
    check = selectors.call_identity(call=tampered, run=run)
    assert check.verdict == protocol.MISMATCH and check.recomputed_call_id == tampered.recomputed_call_id
    assert {code for code, *_ in check.problems} == {"identity_mismatch", "input_digest_mismatch"}
    clean = first_call_of("clean-run")
    assert selectors.call_identity(call=clean, run=clean.run).verified


def test_call_detail_gathers_events_confirmation_and_findings(demo, django_assert_max_num_queries):
    run = Run.objects.get(run_id="tampered-receipt")
    call = first_call_of("tampered-receipt")
    with django_assert_max_num_queries(4):
        detail = selectors.call_detail(run=run, call=call)
    assert [event.payload["status"] for event in detail.events] == ["prepared", "committed"]
    assert detail.confirmation is None
    assert {finding.code for finding in detail.findings} == {"identity_mismatch", "input_digest_mismatch"}


def test_disposition_history_is_in_ledger_order(demo):
    run = Run.objects.get(run_id="conflict-same-id")
    history = selectors.disposition_history(run=run, submission_ids=["conflict-submission"])
    assert [event.disposition for event in history["conflict-submission"]] == ["created", "conflict"]


def test_decisions_are_counted_and_ranked_most_urgent_first(demo):
    run = Run.objects.get(run_id="clean-run")
    last = Call.objects.filter(run=run).order_by("-call_id").first()
    assert last is not None
    Call.objects.filter(pk=last.pk).update(decision="confirm")
    stats.refresh_run_summary(run)
    assert selectors.decision_counts(run=run) == [("confirm", 1), ("reuse", 2)]
    ranked = list(selectors.calls_by_decision(run=run).values_list("decision", flat=True))
    assert ranked == ["confirm", "reuse", "reuse"]


def test_stale_items_find_their_submission_by_the_findings_record_key(demo):
    finding = Finding.objects.get(code="stale_reservation", closed_at__isnull=True)
    Finding.objects.filter(pk=finding.pk).update(subject="a subject no parser could read")
    items = selectors.stale_items(selectors.stale_findings())
    [reservation] = [item for item in items if item.kind == "reservation"]
    assert (reservation.run_id, reservation.subject) == ("stale-reservation", "stale-submission")
    assert reservation.task_present is True and "adopts the task file" in reservation.resume
    assert {item.kind for item in items} == {"reservation", "call"}


def test_the_events_histogram_counts_every_event_once(demo):
    run = Run.objects.get(run_id="a4-concurrent")
    buckets = selectors.events_histogram(run=run)
    assert len(buckets) == 24 and sum(count for _, count in buckets) == Event.objects.filter(run=run).count()
