"""Never lose what a person typed: a live run page keeps refreshing around a form being
edited and never replaces it (static/js/dashboard.js, hx-preserve on the run page's forms)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from evidence.ingest import importer
from evidence.models import Call, HumanDecision
from receipts import durable
from tests.browser.conftest import PASSWORD, log_in, screenshot
from tests.helpers import join

pytestmark = pytest.mark.browser
TYPED = "the customer's lawyer asked us to keep"


@pytest.fixture
def admin_page(page, django_user_model):
    join(django_user_model.objects.create_user("ada", password=PASSWORD), "admin")
    page.goto("/")
    page.get_by_label("User name").fill("ada")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/")
    return page


def append_and_import(run_dir, text: str) -> None:
    durable.append_event(run_dir, "note", {"text": text})
    importer.run_import(path=run_dir)


def test_the_live_refresh_goes_on_around_a_reason_being_typed(admin_page, live_demo):
    page = admin_page
    page.goto("/runs/send-message-killed/")
    expect(page.get_by_text("refreshing every 3 seconds while this tab is open")).to_be_visible()
    page.get_by_text("Set a legal hold", exact=True).first.click()  # the hold is a secondary action, folded
    reason = page.locator("#hold-reason")
    reason.click()
    reason.press_sequentially(TYPED[:20])
    append_and_import(live_demo / "send-message-killed", "first event while typing")
    expect(page.locator("#timeline")).to_contain_text("first event while typing", timeout=12_000)
    reason.press_sequentially(TYPED[20:])  # typing goes on into the same field, still focused
    expect(reason).to_have_value(TYPED)
    expect(reason).to_be_focused()
    page.locator("h1").click()  # focus elsewhere: the text stays through the next refreshes too
    append_and_import(live_demo / "send-message-killed", "second event, field left")
    expect(page.locator("#timeline")).to_contain_text("second event, field left", timeout=12_000)
    expect(reason).to_have_value(TYPED)
    screenshot(page, "run-live-typing")


def test_a_form_without_preserve_pauses_the_refresh_while_edited(admin_page, live_demo):
    """The net under any posting form not marked hx-preserve: its answer is dropped while a
    field is focused or changed, and the refresh resumes once it is not."""
    page = admin_page
    page.goto("/runs/send-message-killed/")
    page.locator("#hold-form").evaluate("held => held.removeAttribute('hx-preserve')")
    page.get_by_text("Set a legal hold", exact=True).first.click()
    reason = page.locator("#hold-reason")
    reason.fill(TYPED)
    append_and_import(live_demo / "send-message-killed", "an event the edited page holds back")
    # Two answers after the import (the second was surely asked for after it), waited for rather
    # than timed: a loaded machine's timers run late.
    for _ in range(2):
        with page.expect_response(lambda r: r.url.endswith("/runs/send-message-killed/"), timeout=10_000):
            pass
    expect(reason).to_have_value(TYPED)
    expect(page.locator("#timeline")).not_to_contain_text("an event the edited page holds back")
    reason.fill("")
    page.locator("h1").click()
    expect(page.locator("#timeline")).to_contain_text("an event the edited page holds back", timeout=12_000)


def test_a_settle_sent_from_a_tab_opened_before_a_new_login_keeps_what_was_typed(page, demo):
    """The old tab's token died with the old session: the settle comes back filled in, with
    nothing done, and goes through once the call_id is typed again."""
    join(User.objects.get(username="alice"), "confirmer")
    call = Call.objects.get(run__run_id="send-message-killed")
    log_in(page)
    page.goto(f"/runs/send-message-killed/calls/{call.call_id}/")
    reason = "The customer forwarded the refund e-mail to support."
    page.get_by_label("It happened (committed)").check()
    page.get_by_label("Reason").fill(reason)
    page.get_by_label("Type the first 12 characters of the call_id").fill(call.call_id[:12])
    other_tab = page.context.new_page()  # logs out and in again: the session and its token change
    other_tab.goto("/")
    other_tab.get_by_role("button", name="Log out").click()
    other_tab.goto("/")
    other_tab.get_by_label("User name").fill("alice")
    other_tab.get_by_label("Password").fill(PASSWORD)
    other_tab.get_by_role("button", name="Log in").click()
    # Closing a tab while its login is still navigating hung Chromium for 15 minutes once
    # (CI, stop 29): close it only after the new session's page has landed.
    expect(other_tab.get_by_role("navigation", name="Main")).to_be_visible()
    other_tab.close()
    page.get_by_role("button", name="Settle this call").click()
    expect(page.get_by_role("alert")).to_contain_text("Nothing was done")
    expect(page.get_by_label("Reason")).to_have_value(reason)
    expect(page.get_by_label("It happened (committed)")).to_be_checked()
    expect(page.get_by_label("Type the first 12 characters of the call_id")).to_have_value("")
    assert not HumanDecision.objects.exists()
    screenshot(page, "settle-csrf-refused")
    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(page, "settle-csrf-refused-390")
    page.get_by_label("Type the first 12 characters of the call_id").fill(call.call_id[:12])
    page.get_by_role("button", name="Settle this call").click()
    expect(page.get_by_role("status")).to_contain_text("Settled as committed")
    assert HumanDecision.objects.get().reason == reason


def test_a_login_with_no_role_sees_who_can_give_one(chromium, live_server, demo, django_user_model):
    join(django_user_model.objects.create_user("ana", email="ana@example.org"), "admin")
    django_user_model.objects.create_user("newcomer", password=PASSWORD)
    for width, height in ((1366, 768), (390, 844)):
        context = chromium.new_context(viewport={"width": width, "height": height}, base_url=live_server.url)
        page = context.new_page()
        page.goto("/")
        page.get_by_label("User name").fill("newcomer")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        expect(page.get_by_role("heading", name="You have no role yet")).to_be_visible()
        expect(page.get_by_role("link", name="ana@example.org")).to_be_visible()
        expect(page.get_by_role("navigation", name="Main")).to_have_count(0)
        screenshot(page, f"no-role-{width}")
        context.close()
