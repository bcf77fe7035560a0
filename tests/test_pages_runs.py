"""The runs list, a run's page, and the search box."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
from http import HTTPStatus

import pytest
from django.urls import reverse

from evidence.ingest import importer
from evidence.models import Run
from evidence.words import i18n
from receipts import durable, protocol, runtime
from tests.helpers import content, first_call_of, state_badge

pytestmark = pytest.mark.django_db


def test_runs_page_lists_every_run_with_its_facts(logged_in, demo):
    response = logged_in.get("/")
    assert response.status_code == HTTPStatus.OK
    page = content(response)
    for run in Run.objects.all():
        assert f'href="/runs/{run.run_id}/"' in page
    assert "9 runs" in page and "5 need attention" in page
    assert '<svg class="chart"' in page and 'aria-label="calls: 3 committed"' in page


def test_runs_filters_by_state_and_attention(logged_in, demo):
    running = content(logged_in.get("/?state=running"))
    assert 'href="/runs/send-message-killed/"' in running and "clean-run</a>" not in running
    attention = content(logged_in.get("/?attention=1"))
    assert "tampered-receipt" in attention and "a4-concurrent</a>" not in attention


def test_runs_filter_answers_htmx_with_the_table_only(logged_in, demo):
    response = logged_in.get("/?attention=1", headers={"HX-Request": "true"})
    page = content(response)
    assert page.lstrip().startswith('<section id="runs-table">')
    assert "<html" not in page


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_runs_download_keeps_the_filters(logged_in, demo, fmt):
    response = logged_in.get(f"/?attention=1&format={fmt}")
    assert response.status_code == HTTPStatus.OK
    assert response["Content-Disposition"] == f'attachment; filename="runs.{fmt}"'
    body = content(response)
    if fmt == "csv":
        rows = list(csv.reader(io.StringIO(body)))
        header, rows = rows[0], rows[1:]
    else:
        items = json.loads(body)["items"]
        header, rows = list(items[0]), [list(item.values()) for item in items]
    assert header[0] == "run_id"
    assert sorted(row[0] for row in rows) == sorted(
        ["tampered-receipt", "stale-reservation", "write-file-killed", "send-message-killed", "conflict-same-id"]
    )


def test_run_page_filters_the_ledger_by_event_type(logged_in, demo):
    page = content(logged_in.get("/runs/clean-run/?type=receipt"))
    timeline = page[page.index('id="timeline"') : page.index('id="calls"')]
    assert "receipt" in timeline and ">state<" not in timeline


POLL = 'hx-trigger="every 3s" data-poll-visible'  # static/js/dashboard.js cancels a poll in a hidden tab


def test_a_run_that_wrote_lately_polls_only_while_the_tab_is_visible(logged_in, demo):
    live = content(logged_in.get("/runs/send-message-killed/"))
    assert POLL in live and "refreshing every 3 seconds while this tab is open" in live
    finished = content(logged_in.get("/runs/clean-run/"))
    assert "every 3s" not in finished


def test_a_killed_run_left_retrying_is_not_live(logged_in, demo):
    an_hour_ago = protocol.utc_now() - dt.timedelta(hours=1)
    Run.objects.filter(run_id="send-message-killed").update(last_event_at=an_hour_ago, activity_at=an_hour_ago)
    page = content(logged_in.get("/runs/send-message-killed/"))
    assert "every 3s" not in page and re.search(r"not live: last event <time [^>]*>1 h 0 min ago</time>", page)


def test_the_poll_refreshes_the_whole_run_page(logged_in, demo):
    run_dir = demo / "send-message-killed"
    durable.append_event(run_dir, "note", {"text": "appended while watching"})
    runtime.Executor(run_dir).call("send_message", {"to": "x@example.com", "body": "another"}, attempt=1)
    importer.run_import(path=run_dir)
    response = logged_in.get("/runs/send-message-killed/", headers={"HX-Request": "true", "HX-Target": "run-body"})
    page = content(response)
    assert page.lstrip().startswith('<div id="run-body"')
    assert "appended while watching" in page, "the ledger"
    assert 'aria-label="calls: 1 committed, 1 in doubt"' in page, "the charts and the summary"
    assert page.count('<th scope="row"><a href="/runs/send-message-killed/calls/') == 2, "the calls"


def test_a_ledger_filter_swaps_the_ledger_only(logged_in, demo):
    response = logged_in.get("/runs/clean-run/?type=state", headers={"HX-Request": "true", "HX-Target": "timeline"})
    assert content(response).lstrip().startswith('<section id="timeline"')


@pytest.mark.parametrize("which", ["events", "calls", "submissions"])
def test_run_downloads(logged_in, demo, which):
    response = logged_in.get(f"/runs/clean-run/?list={which}&format=json")
    document = json.loads(content(response))
    expected = {"events": 10, "calls": 3, "submissions": 1}[which]
    assert len(document["items"]) == document["total"] == expected


def test_search_jumps_to_a_run_a_call_or_a_submission(logged_in, demo):
    assert logged_in.get("/search/?q=clean-run")["Location"] == "/runs/clean-run/"
    call = first_call_of("write-file-killed")
    assert logged_in.get(f"/search/?q={call.call_id[:10]}")["Location"] == reverse(
        "call", args=["write-file-killed", call.call_id]
    )
    assert logged_in.get("/search/?q=a2-submission")["Location"].startswith("/runs/a2-lost-response/?submission=")
    nothing = logged_in.get("/search/?q=zzz-nothing")
    assert nothing.status_code == HTTPStatus.OK and "Nothing has this" in content(nothing)


def test_hostile_event_payloads_never_break_a_page(logged_in, demo):
    run_dir = demo / "clean-run"
    call = first_call_of("clean-run")
    hostile = {"status": ["x"], "tool": {"a": 1}, "attempt": [1], "state": {"s": 1}, "task_id": ["t"]}
    durable.append_event(run_dir, "receipt", {**hostile, "call_id": call.call_id})
    durable.append_event(run_dir, "state", {"state": ["running"], "attempts": {"n": 1}})
    durable.append_event(run_dir, "submission", {"client_submission_id": "demo-clean-1", "reason": ["r"], **hostile})
    durable.append_event(run_dir, "confirmation", {"resolution": [1], "actor": {"name": "x"}})
    importer.run_import(path=run_dir)
    for url in ("/runs/clean-run/", reverse("call", args=["clean-run", call.call_id])):
        response = logged_in.get(url)
        assert response.status_code == HTTPStatus.OK, url
        assert "[&quot;x&quot;]" in content(response), "shown as the JSON it is, escaped"
    assert logged_in.get("/runs/clean-run/?format=csv").status_code == HTTPStatus.OK


def test_links_and_redirects_encode_a_submission_id(logged_in, demo):
    from receipts import runtime

    run_dir = demo / "stale-reservation"  # still retrying: a finished run creates no task
    runtime.write_task(run_dir, {"subject": "x"}, "a&b=c #d?")
    importer.run_import(path=run_dir)
    location = logged_in.get("/search/", {"q": "a&b=c #d?"})["Location"]
    assert location == "/runs/stale-reservation/?submission=a%26b%3Dc+%23d%3F#submissions"
    page = content(logged_in.get(location))
    assert "Showing submission" in page and "a&amp;b=c #d?" in page


def test_a_recovered_creation_says_so_in_the_disposition_history(logged_in, demo):
    page = content(logged_in.get("/runs/a2-lost-response/"))
    history = page[page.index("Disposition history") :]
    assert "recovered: a crash kept this event out of the ledger" in history
    assert history.index('badge-ok">created') < history.index('badge-info">reused')


def test_run_page_shows_ledger_calls_dispositions_and_findings(logged_in, demo):
    page = content(logged_in.get("/runs/conflict-same-id/"))
    assert "Disposition history" in page
    assert 'badge-ok">created' in page and state_badge("conflict") in page
    assert "request_digest_differs" in page
    assert "submission_conflict" in page


def test_a_receipt_that_fails_its_identity_check_is_never_shown_as_committed(logged_in, demo):
    runs = content(logged_in.get("/"))
    assert 'aria-label="calls: 1 tampered"' in runs
    run = content(logged_in.get("/runs/tampered-receipt/"))
    calls = run[run.index('id="calls"') :]
    assert state_badge("tampered") in calls and state_badge("committed") not in calls
    call = first_call_of("tampered-receipt")
    page = content(logged_in.get(reverse("call", args=["tampered-receipt", call.call_id])))
    lead = page[page.index('class="lead state-line"') :][:1500]
    assert state_badge("tampered") in lead and "The receipt says committed, and proves nothing" in lead


def test_each_run_has_a_verdict(logged_in, demo):
    items = json.loads(content(logged_in.get("/?format=json")))["items"]
    verdicts = {item["run_id"]: item["verdict"] for item in items}
    assert verdicts["clean-run"] == "ok" and verdicts["tampered-receipt"] == "tampered"
    assert verdicts["conflict-same-id"] == "conflict" and verdicts["send-message-killed"] == "in doubt"
    assert verdicts["stale-reservation"] == "in doubt"
    assert list(items[0]) == [
        "run_id", "state", "attempts", "verdict", "first_event_at", "last_event_at", "events", "calls",
        "calls_by_status", "in_doubt", "stale_reservations", "open_findings", "archived", "legal_hold",
    ]  # fmt: skip


def test_a_history_that_starts_with_reused_shows_when_the_task_was_created(logged_in, demo_root):
    from receipts.demo import login_request, run_writer

    run_dir = demo_root / "lost"
    runtime.run_init(run_dir, contract_sha256="c" * 64)
    request = json.dumps(login_request()).encode()
    args = ("write-task", str(run_dir), "--request", "-", "--submission-id", "old-writer")
    assert run_writer(*args, stdin=request, RECEIPTS_FAILPOINT="after_commit").returncode == 137
    # What a writer from before the recovered event left: the retry's "reused" and nothing else.
    record = next((run_dir / "submissions").iterdir())
    document = json.loads(record.read_bytes())
    event = {
        "client_submission_id": "old-writer",
        "disposition": "reused",
        "request_digest": document["request_digest"],
    }
    durable.append_event(run_dir, "submission", event | {"action_taken": False, "task_id": document["task_id"]})
    importer.run_import(path=run_dir)
    page = content(logged_in.get("/runs/lost/"))
    created_at = protocol.parse_time(document["creation_result"]["created_at"])
    shown = f'<time datetime="{protocol.format_time(created_at)}" title="{i18n.shown_time(created_at)}" data-local>'
    assert f"The ledger's history of this submission starts with “reused”: its creation, at {shown}" in page


def test_an_empty_search_says_what_it_takes(logged_in, demo):
    page = content(logged_in.get("/search/?q="))
    assert "Search takes a run id or part of one" in page and "TASK-000001" in page
