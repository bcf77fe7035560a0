"""A person settles a call in doubt in a real browser; the runtime then resumes and follows it."""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from evidence.models import Call, HumanDecision
from receipts.demo import run_writer
from tests.browser.conftest import PASSWORD, log_in, screenshot
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
    from evidence.ingest import importer

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
    # The outbox shows no line: "it happened" asks twice.
    panel.get_by_label("I have checked the target myself: decide against what it shows").check()
    panel.get_by_role("button", name="Settle this call").click()
    expect(page.get_by_role("status")).to_contain_text("Settled as committed")

    resumed = run_writer(*args)
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["reused"] is True
    assert (run_dir / "outbox.jsonl").read_bytes() == b"", "nothing was sent again"


def test_a_decision_made_away_from_the_runs_host_waits_for_it_then_shows_delivered(page, demo, settings):
    from evidence.ingest import delivery
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


PHONE = {"width": 390, "height": 844}
QUESTION = "This call is in doubt: did it happen?"


def phone_page(chromium, live_server, **options):
    """A confirmer's browser at a phone's width."""
    join(User.objects.create_user("alice", password=PASSWORD), "viewer", "confirmer")
    context = chromium.new_context(viewport=PHONE, base_url=live_server.url, **options)
    context.set_default_timeout(10_000)
    return context, context.new_page()


def on_screen(page, locator) -> bool:
    box = locator.bounding_box()
    return box is not None and box["y"] >= -1 and box["y"] + box["height"] <= page.viewport_size["height"] + 1


def test_at_a_phones_width_the_question_and_its_answers_are_on_the_first_screen(chromium, live_server, demo):
    call = Call.objects.get(run__run_id="send-message-killed")
    context, page = phone_page(chromium, live_server)
    log_in(page)
    page.goto(f"/runs/send-message-killed/calls/{call.call_id}/")
    panel = page.get_by_role("region", name=QUESTION)
    answer = panel.get_by_label("It happened (committed)")
    figures = {"panel": panel.bounding_box()["y"], "answers": answer.bounding_box()["y"]}
    print(f"at 390 px: the panel starts at {figures['panel']:.0f} px, its first answer at {figures['answers']:.0f} px")
    screenshot(page, "390-settle-first-screen")
    assert on_screen(page, panel.get_by_role("heading", name=QUESTION)) and on_screen(page, answer), figures
    context.close()


def test_every_field_that_does_not_hold_is_said_at_once_in_a_summary_that_takes_focus(chromium, live_server, demo):
    call = Call.objects.get(run__run_id="send-message-killed")
    context, page = phone_page(chromium, live_server)
    log_in(page)
    page.goto(f"/runs/send-message-killed/calls/{call.call_id}/")
    panel = page.get_by_role("region", name=QUESTION)
    panel.get_by_label("Reason").fill("   ")
    panel.get_by_label("Type the first 12 characters of the call_id").fill("000000000000")  # the settle's rule
    panel.get_by_role("button", name="Settle this call").click()  # no answer chosen either

    summary = page.get_by_role("alert")
    expect(summary).to_be_focused()
    assert on_screen(page, summary), "the page lands on the summary, not at its top"
    expect(summary.get_by_role("link")).to_have_text(
        [re.compile("^Choose whether the call happened"), re.compile("^Give the reason for your decision"),
         re.compile("^Type the first 12 characters")]
    )  # fmt: skip
    call_id_box = panel.get_by_label("Type the first 12 characters of the call_id")
    expect(call_id_box).to_have_value("000000000000")  # everything typed is kept
    expect(call_id_box).to_have_attribute("aria-invalid", "true")
    expect(call_id_box).to_have_accessible_description(re.compile("Type the first 12 characters of this call"))
    screenshot(page, "390-settle-summary")

    summary.get_by_role("link", name=re.compile("Type the first 12")).click()
    expect(call_id_box).to_be_focused()
    page.keyboard.press("Control+A")
    page.keyboard.type(call.call_id[:12])
    panel.get_by_label("It did not happen (rejected)").check()
    panel.get_by_label("Reason").fill("Nothing in the mail log.")
    panel.get_by_role("button", name="Settle this call").click()
    # The outbox shows the message: "did not happen" asks twice.
    panel.get_by_label("I have checked the target myself: decide against what it shows").check()
    panel.get_by_role("button", name="Settle this call").click()
    expect(page.get_by_role("status")).to_contain_text("Settled as rejected")
    assert HumanDecision.objects.get().reason == "Nothing in the mail log."
    context.close()


def test_without_javascript_the_answer_lands_on_the_summary_with_what_was_typed(chromium, live_server, demo):
    call = Call.objects.get(run__run_id="send-message-killed")
    context, page = phone_page(chromium, live_server, java_script_enabled=False)
    log_in(page)
    page.goto(f"/runs/send-message-killed/calls/{call.call_id}/")
    panel = page.get_by_role("region", name=QUESTION)
    panel.get_by_label("It happened (committed)").check()
    panel.get_by_label("Type the first 12 characters of the call_id").fill(call.call_id[:12])
    panel.get_by_role("button", name="Settle this call").click()
    expect(page).to_have_url(re.compile("#settle-errors$"))
    summary = page.get_by_role("alert")
    expect(summary).to_contain_text("Give the reason for your decision")
    expect(summary).to_be_focused()  # autofocus: HTML's, not a script's
    assert on_screen(page, summary)
    expect(panel.get_by_label("It happened (committed)")).to_be_checked()
    expect(panel.get_by_label("Type the first 12 characters of the call_id")).to_have_value(call.call_id[:12])
    assert not HumanDecision.objects.exists()
    context.close()
