"""A person settles a call in doubt in a real browser; the runtime then resumes and follows it."""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from evidence.models import Call, HumanDecision
from receipts.demo import run_writer
from tests.browser.conftest import log_in, screenshot
from tests.helpers import join

pytestmark = pytest.mark.browser

MESSAGE = {"to": "customer@example.com", "body": "Your refund of 40 EUR is on its way"}


def test_a_person_settles_a_killed_message_and_the_resume_sends_nothing_twice(page, demo):
    join(User.objects.get(username="alice"), "confirmer")
    run_dir = demo / "send-message-killed"
    call = Call.objects.get(run__run_id="send-message-killed")
    log_in(page)
    page.goto(f"/runs/send-message-killed/calls/{call.call_id}/")
    panel = page.get_by_role("region", name="This call is in doubt: did it happen?")
    expect(panel).to_contain_text("Send a message to customer@example.com")
    expect(panel).to_contain_text("line 1: message msg-")
    screenshot(page, "settle-before")

    panel.get_by_label("It happened (committed)").check()
    panel.get_by_label("Reason").fill("The customer forwarded the refund e-mail to support.")
    panel.get_by_label("Type the first 12 characters of the call_id").fill(call.call_id[:12])
    panel.get_by_role("button", name="Settle this call").click()

    expect(page.get_by_role("status")).to_contain_text("Settled as committed")
    expect(page.get_by_role("region", name="Settled by a person")).to_contain_text(
        f"alice #{User.objects.get(username='alice').pk} decided at"
    )
    expect(page.get_by_text("This call is in doubt")).to_have_count(0)
    screenshot(page, "settle-after")
    assert HumanDecision.objects.get().actor == "alice"

    page.get_by_role("link", name="Audit entry").click()
    expect(page).to_have_url(re.compile(r"/audit/\?run=send-message-killed"))
    expect(page.locator("#audit-table tbody")).to_contain_text("The customer forwarded the refund e-mail to support.")
    screenshot(page, "audit")

    args = ("call", str(run_dir), "--tool", "send_message", "--args", json.dumps(MESSAGE), "--attempt", "1")
    resumed = run_writer(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["reused"] is True
    assert len((run_dir / "outbox.jsonl").read_bytes().splitlines()) == 1, "the message was sent once"


def test_a_person_who_mistypes_the_call_id_is_told_and_nothing_is_recorded(page, demo):
    join(User.objects.get(username="alice"), "confirmer")
    call = Call.objects.get(run__run_id="send-message-killed")
    log_in(page)
    page.goto(f"/runs/send-message-killed/calls/{call.call_id}/")
    panel = page.get_by_role("region", name="This call is in doubt: did it happen?")
    panel.get_by_label("It did not happen (rejected)").check()
    panel.get_by_label("Reason").fill("Nothing in the mail log.")
    panel.get_by_label("Type the first 12 characters of the call_id").fill("000000000000")
    panel.get_by_role("button", name="Settle this call").click()
    expect(page.get_by_role("alert")).to_contain_text("Type the first 12 characters")
    expect(panel.get_by_label("Reason")).to_have_value("Nothing in the mail log.")
    screenshot(page, "settle-mistyped")
    assert not HumanDecision.objects.exists()


def test_a_disputed_commit_is_settled_in_the_browser_and_the_writer_reuses_it(page, demo):
    """The clean run's message line is gone from the outbox: the writer refuses to reuse the commit,
    the page says disputed, a person settles it, and the runtime follows without sending again."""
    from evidence import importer

    join(User.objects.get(username="alice"), "confirmer")
    run_dir = demo / "clean-run"
    (run_dir / "state.json").write_text(json.dumps({"name": "running", "attempts": 1}))
    message = {"to": "ops@example.com", "body": "Price fix deployed"}
    args = ("call", str(run_dir), "--tool", "send_message", "--args", json.dumps(message), "--attempt", "1")
    (run_dir / "outbox.jsonl").write_bytes(b"")
    refused = run_writer(*args)
    assert refused.returncode == 4, refused.stdout
    call_id = json.loads(refused.stdout)["call_id"]
    importer.run_import(path=run_dir)

    log_in(page)
    page.goto(f"/runs/clean-run/calls/{call_id}/")
    expect(page.locator("p.lead")).to_contain_text("disputed")
    expect(page.get_by_text("disputed: its target did not show this result")).to_be_visible()
    screenshot(page, "call-disputed")
    panel = page.get_by_role("region", name="This call is in doubt: did it happen?")
    panel.get_by_label("It happened (committed)").check()
    panel.get_by_label("Reason").fill("The message is in the mail server's sent log; the outbox was truncated.")
    panel.get_by_label("Type the first 12 characters of the call_id").fill(call_id[:12])
    panel.get_by_role("button", name="Settle this call").click()
    expect(page.get_by_role("status")).to_contain_text("Settled as committed")

    resumed = run_writer(*args)
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["reused"] is True
    assert (run_dir / "outbox.jsonl").read_bytes() == b"", "nothing was sent again"


def test_a_decision_made_away_from_the_runs_host_waits_for_it_then_shows_delivered(page, demo, settings):
    from evidence import delivery
    from evidence.models import Host

    join(User.objects.get(username="alice"), "confirmer")
    owner = settings.EVIDENCE_HOST_NAME
    settings.EVIDENCE_HOST_NAME = "web-host"  # the live server is not the run's host
    call = Call.objects.get(run__run_id="send-message-killed")
    log_in(page)
    page.goto(f"/runs/send-message-killed/calls/{call.call_id}/")
    panel = page.get_by_role("region", name="This call is in doubt: did it happen?")
    expect(panel).to_contain_text(f"the run's files are on host {owner}")
    panel.get_by_label("It happened (committed)").check()
    panel.get_by_label("Reason").fill("The customer forwarded the refund e-mail to support.")
    panel.get_by_label("Type the first 12 characters of the call_id").fill(call.call_id[:12])
    panel.get_by_role("button", name="Settle this call").click()
    expect(page.get_by_role("status")).to_contain_text(f"Host {owner} writes it into the run directory")
    settled = page.get_by_role("region", name="Settled by a person")
    expect(settled).to_contain_text(f"Decided, waiting for host {owner} to write it into the run directory")
    screenshot(page, "settle-waiting-for-host")
    assert not (demo / "send-message-killed" / "confirmations" / f"{call.call_id}.json").exists()

    settings.EVIDENCE_HOST_NAME = owner
    delivery.deliver_pending(host=Host.objects.get(name=owner))
    page.reload()
    expect(page.get_by_role("region", name="Settled by a person")).to_contain_text(f"Delivered to host {owner}")
    screenshot(page, "settle-delivered")
