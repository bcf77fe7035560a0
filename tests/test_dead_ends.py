"""Issue 37's dead ends: every page a person can land on says what to do next, in their language."""

from __future__ import annotations

import html as html_module
import json
import re
import shlex
import subprocess
import sys
from http import HTTPStatus

import pytest
from django.urls import reverse

from evidence.models import Call, Finding
from evidence.review import selectors
from evidence.review.inbox import inbox_total
from tests.helpers import content, join

pytestmark = pytest.mark.django_db


@pytest.fixture
def exporter(client, demo, django_user_model):
    client.force_login(join(django_user_model.objects.create_user("erin"), "viewer", "exporter"))
    return client


@pytest.mark.parametrize(
    ("language", "said"),
    [("en", "Ask for one on"), ("zh-hans", "请在")],
)
def test_the_evidence_link_before_any_export_says_to_ask_for_one_on_the_run_page(exporter, language, said):
    exporter.cookies["callproof_language"] = language
    response = exporter.get(reverse("run_evidence", args=["clean-run"]))
    html = content(response)
    assert response.status_code == HTTPStatus.NOT_FOUND
    assert said in html and 'href="/runs/clean-run/#exports"' in html
    assert "no longer imported" not in html and "不再" not in html


def test_the_exports_panel_opened_as_an_address_is_a_whole_page_and_htmx_still_gets_the_panel(exporter):
    page = content(exporter.get(reverse("export_panel", args=["clean-run"])))
    assert page.startswith("<!doctype html>") and "<h1>" in page and 'id="exports"' in page
    assert 'href="/static/css/site.css"' in page or "site.css" in page
    fragment = content(exporter.get(reverse("export_panel", args=["clean-run"]), headers={"HX-Request": "true"}))
    assert fragment.lstrip().startswith('<div id="exports"') and "<html" not in fragment


@pytest.mark.parametrize(
    ("language", "role"),
    [("en", "it needs the <strong>exporter</strong> role"), ("zh-hans", "<strong>导出人</strong>")],
)
def test_not_allowed_names_the_role_needed_and_who_can_give_it(client, demo, django_user_model, language, role):
    join(django_user_model.objects.create_user("ada", email="ada@example.com"), "admin")
    client.force_login(join(django_user_model.objects.create_user("vera"), "viewer"))
    client.cookies["callproof_language"] = language
    refused = client.get(reverse("run_evidence", args=["clean-run"]))
    html = content(refused)
    assert refused.status_code == HTTPStatus.FORBIDDEN
    assert role in html and "ada@example.com" in html


def test_a_refusal_to_triage_names_the_confirmer_role(client, demo, django_user_model):
    client.force_login(join(django_user_model.objects.create_user("vera"), "viewer"))
    finding = Finding.objects.get(code="submission_conflict")
    html = content(client.post(reverse("triage_action", args=[finding.pk]), {"action": "acknowledge", "reason": "x"}))
    assert "it needs the <strong>confirmer</strong> role" in html


def test_a_filtered_empty_inbox_says_how_many_need_a_person_in_all(logged_in, demo):
    waiting = inbox_total()
    assert waiting > 1  # the demo's real items: calls in doubt, a tampered receipt, a conflict, a stale reservation
    html = content(logged_in.get(reverse("inbox"), {"run": "clean-run"}))
    assert f"Nothing of this kind; {waiting} items need a person in all." in html
    assert '<a href="/inbox/">Show every open item</a>' in html
    assert "Nothing needs a person." not in html
    unfiltered = content(logged_in.get(reverse("inbox")))
    assert "Nothing of this kind" not in unfiltered


def test_a_call_the_runtime_can_check_says_how_to_resume_with_the_command_that_does(logged_in, demo):
    call = Call.objects.get(run__run_id="write-file-killed")
    assert call.decision == "query"
    html = content(logged_in.get(reverse("call", args=[call.run.run_id, call.call_id])))
    assert 'id="resume-how"' in html and "docs/runtime-authors.md" in html
    command = html.split('<code class="command" translate="no">', 1)[1].split("</code>", 1)[0]
    words = shlex.split(html_module.unescape(command))
    assert words[:7] == ["python", "-m", "receipts", "call", call.run.path, "--tool", "write_file"]
    assert words[words.index("--attempt") + 1] == str(call.attempt)
    assert json.loads(words[words.index("--args") + 1]) == call.args
    # The command does what the page says: the same call_id, the target asked, nothing run twice.
    ran = subprocess.run([sys.executable, *words[1:]], capture_output=True, text=True, check=False)
    said = json.loads(ran.stdout)
    assert ran.returncode == 0 and said["call_id"] == call.call_id
    assert said["status"] == "committed" and said["reused"] is True
    inbox = content(logged_in.get(reverse("inbox")))
    assert f'/runs/write-file-killed/calls/{call.call_id}/#resume-how">How to resume</a>' in inbox
    run_page = content(logged_in.get(reverse("run", args=["write-file-killed"])))
    assert f'href="/runs/write-file-killed/calls/{call.call_id}/#resume-how">How to resume</a>' in run_page


def test_the_stale_page_offers_to_settle_a_stale_call_in_doubt(logged_in, demo):
    html = content(logged_in.get(reverse("reservations")))
    for run_id in ("send-message-killed", "write-file-killed"):
        call = Call.objects.get(run__run_id=run_id)
        assert f'<a class="action" href="/runs/{run_id}/calls/{call.call_id}/">Settle the call</a>' in html


def test_the_api_docs_are_a_page_behind_the_login_that_loads_nothing_from_elsewhere(client, logged_in, demo):
    html = content(logged_in.get("/api/docs"))
    assert 'id="swagger-ui"' in html and "/static/ninja/swagger-ui-bundle.js" in html
    # Every address the page names is this site's own (no CDN): a path, or a fragment.
    addresses = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert addresses and all(a.startswith(("/", "#")) and not a.startswith("//") for a in addresses), addresses
    logged_in.logout()
    refused = client.get("/api/docs")
    assert refused.status_code == HTTPStatus.FOUND and refused["Location"].startswith("/accounts/login/")


def test_search_finds_a_recipients_address_in_a_calls_arguments(logged_in, demo):
    call = Call.objects.get(run__run_id="send-message-killed")
    assert isinstance(call.args, dict) and call.args["to"] == "customer@example.com"
    found = logged_in.get(reverse("search"), {"q": "Customer@Example.com"})
    assert found.status_code == HTTPStatus.FOUND  # the one match: its page
    assert found["Location"] == f"/runs/send-message-killed/calls/{call.call_id}/"


def test_search_reads_the_arguments_of_the_newest_calls_only(logged_in, demo, monkeypatch):
    newer = Call.objects.filter(pk__gt=Call.objects.get(run__run_id="send-message-killed").pk).count()
    monkeypatch.setattr(selectors, "ARGUMENTS_SCANNED", newer)  # the window ends just after it
    html = content(logged_in.get(reverse("search"), {"q": "customer@example.com"}))
    assert f"No call among the newest {newer} has it in its arguments either." in html
