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
    for run_id, remaining in (("send-message-killed", "4"), ("write-file-killed", "3"), ("tampered-receipt", "2")):
        row = page.locator("#inbox-list tbody tr", has_text=run_id)
        row.get_by_role("link", name="Settle").click()
        panel = page.get_by_role("region", name="This call is in doubt: did it happen?")
        call_id = page.url.rstrip("/").rsplit("/", 1)[1]
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
