"""An operator works through the demo's inbox: each call in doubt is settled and leaves it."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from tests.browser.conftest import log_in, screenshot
from tests.helpers import join

pytestmark = pytest.mark.browser


def test_an_operator_settles_every_call_in_the_inbox_and_sees_each_leave(page, demo):
    join(User.objects.get(username="alice"), "confirmer")
    log_in(page)
    page.get_by_role("navigation", name="Main").get_by_role("link", name=re.compile("Inbox")).click()
    expect(page.get_by_role("heading", name="Inbox: what needs a person")).to_be_visible()
    count = page.locator("header .count")
    expect(count).to_have_text("5")
    screenshot(page, "inbox-before")
    # Each call's next step as the inbox says it: a person settles, a resume asks the target
    # (deciding by hand waits behind a disclosure), an altered receipt is investigated first.
    steps = (
        ("send-message-killed", "4", "Settle", "This call is in doubt: did it happen?"),
        ("write-file-killed", "3", "Look at the call", "This call is in doubt: did it happen?"),
        ("tampered-receipt", "2", "Investigate", "Altered after it was written: investigate"),
    )
    for run_id, remaining, action, heading in steps:
        row = page.locator("#inbox-list tbody tr", has_text=run_id)
        row.get_by_role("link", name=action).click()
        panel = page.get_by_role("region", name=heading)
        call_id = page.url.rstrip("/").rsplit("/", 1)[1]
        by_hand = panel.get_by_text("Decide by hand anyway")
        if by_hand.count():
            by_hand.click()
        panel.get_by_label("It did not happen (rejected)").check()
        panel.get_by_label("Reason").fill(f"checked {run_id} by hand")
        panel.get_by_label("Type the first 12 characters of the call_id").fill(call_id[:12])
        tick = panel.get_by_label("Decide anyway, although the runtime could ask the target itself")
        if tick.count():
            tick.check()
        panel.get_by_role("button", name="Settle this call").click()
        expect(page.get_by_role("status")).to_contain_text("Settled as rejected")
        page.get_by_role("navigation", name="Main").get_by_role("link", name=re.compile("Inbox")).click()
        expect(page.locator("#inbox-list")).not_to_contain_text(run_id)
        expect(count).to_have_text(remaining)
    screenshot(page, "inbox-after")
    expect(page.locator("#inbox-list tbody")).to_contain_text("conflict")
    expect(page.locator("#inbox-list tbody")).to_contain_text("stale reservation")
