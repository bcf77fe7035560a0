""" "I'm on it" with the keyboard alone: carol tabs to an item's button and presses Enter; the box
changes in place, and dave's inbox and the call's page show her on it; dave's "Take over" asks
first, and only the second press takes it."""

from __future__ import annotations

import re

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth.models import User
from playwright.sync_api import expect

from evidence.models import AuditEntry, Claim
from tests.browser.conftest import PASSWORD, screenshot
from tests.helpers import join

pytestmark = pytest.mark.browser


def logged_in(chromium, live_server, username: str):
    context = chromium.new_context(viewport={"width": 1400, "height": 900}, base_url=live_server.url)
    context.set_default_timeout(10_000)
    page = context.new_page()
    page.goto("/accounts/login/")
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"^https?://[^/]+/$"))  # the runs page: logged in
    return context, page


def tab_to(page, name: str, limit: int = 300) -> None:
    """Press Tab until the button called ``name`` has the keyboard."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if (
            page.evaluate("document.activeElement.tagName === 'BUTTON' && document.activeElement.textContent.trim()")
            == name
        ):
            return
    raise AssertionError(f"no button {name!r} within {limit} presses of Tab")


def test_a_claim_made_with_the_keyboard_shows_on_the_other_persons_pages(chromium, live_server, demo):
    carol = join(User.objects.create_user("carol", password=PASSWORD), "confirmer")
    join(User.objects.create_user("dave", password=PASSWORD), "confirmer")
    carols, page = logged_in(chromium, live_server, "carol")
    page.goto("/inbox/")
    tab_to(page, "I'm on it")
    subject = page.evaluate("document.activeElement.form.elements.subject.value")
    run_id = page.evaluate("document.activeElement.form.elements.run.value")
    kind = page.evaluate("document.activeElement.form.elements.kind.value")
    assert kind in ("in doubt", "tampered"), "the inbox lists the calls first"
    page.keyboard.press("Enter")
    row = page.locator("#inbox-list tbody tr", has=page.locator(f'input[name="subject"][value="{subject}"]'))
    expect(row.locator(".claim-who")).to_contain_text(f"carol #{carol.pk} is on it since")
    expect(row.get_by_role("button", name="Let it go")).to_be_focused()  # the keyboard stays on the item
    assert page.url.endswith("/inbox/"), "htmx swapped the box in place"
    held = Claim.objects.get()
    assert (held.user_id, held.run.run_id, held.subject) == (carol.pk, run_id, subject)
    screenshot(page, "claim-carol-inbox")

    daves, other = logged_in(chromium, live_server, "dave")
    other.goto("/inbox/")
    theirs = other.locator("#inbox-list tbody tr", has=other.locator(f'input[name="subject"][value="{subject}"]'))
    expect(theirs.locator(".claim-who")).to_contain_text(f"carol #{carol.pk} is on it since")
    tab_to(other, "Take over")
    other.keyboard.press("Enter")
    expect(theirs.get_by_role("alert")).to_contain_text("Someone else is on it")
    assert Claim.objects.get().user_id == carol.pk, "asking is not taking"
    screenshot(other, "claim-dave-asked")
    violations = Axe().run(other).response["violations"]
    assert violations == [], [v["id"] for v in violations]  # a claim, and the question, pass axe too
    tab_to(other, "Take it over")
    other.keyboard.press("Enter")
    expect(theirs.locator(".claim-who")).to_contain_text("dave #")
    assert Claim.objects.get().user.username == "dave"
    assert AuditEntry.objects.filter(action=AuditEntry.CLAIMED, actor="dave").exists()
    page.goto(f"/runs/{run_id}/calls/{subject}/")  # carol's page of the call says it too
    expect(page.locator(".claim-who")).to_contain_text(re.compile(r"dave #\d+ is on it since"))
    screenshot(page, "claim-call-page")
    carols.close()
    daves.close()
