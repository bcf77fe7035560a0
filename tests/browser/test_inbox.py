"""An operator works through the demo's inbox: each call in doubt is settled and leaves it."""

from __future__ import annotations

import re
import shutil

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
    # (deciding by hand waits behind a disclosure and a tick), an altered receipt is investigated
    # first.
    # The last: whether the target shows the effect, so that "did not happen" asks twice.
    steps = (
        ("send-message-killed", "4", "Settle", "This call is in doubt: did it happen?", False, True),
        ("write-file-killed", "3", "Look at the call", "This call is in doubt: did it happen?", True, True),
        ("tampered-receipt", "2", "Investigate", "Altered after it was written: investigate", False, False),
    )
    for run_id, remaining, action, heading, target_can_say, shown in steps:
        row = page.locator("#inbox-list tbody tr", has_text=run_id)
        row.get_by_role("link", name=action).click()
        # The call's own page first: read too soon, the URL and the panel are still the inbox's.
        expect(page).to_have_url(re.compile(rf"/runs/{run_id}/calls/[0-9a-f]{{64}}/$"))
        panel = page.get_by_role("region", name=heading)
        expect(panel).to_be_visible()
        call_id = page.url.rstrip("/").rsplit("/", 1)[1]
        if target_can_say:
            panel.get_by_text("Decide by hand anyway").click()
        panel.get_by_label("It did not happen (rejected)").check()
        panel.get_by_label("Reason").fill(f"checked {run_id} by hand")
        panel.get_by_label("Type the first 12 characters of the call_id").fill(call_id[:12])
        if target_can_say:
            panel.get_by_label("Decide anyway, although the runtime could ask the target itself").check()
        panel.get_by_role("button", name="Settle this call").click()
        if shown:
            panel.get_by_label("I have checked the target myself: decide against what it shows").check()
            panel.get_by_role("button", name="Settle this call").click()
        expect(page.get_by_role("status")).to_contain_text("Settled as rejected")
        page.get_by_role("navigation", name="Main").get_by_role("link", name=re.compile("Inbox")).click()
        expect(page.locator("#inbox-list")).not_to_contain_text(run_id)
        expect(count).to_have_text(remaining)
    screenshot(page, "inbox-after")
    expect(page.locator("#inbox-list tbody")).to_contain_text("conflict")
    expect(page.locator("#inbox-list tbody")).to_contain_text("stale reservation")


KEEPS_FOCUS_AND_SCROLL = "() => [document.activeElement.getAttribute('href'), window.scrollY]"


def test_the_live_refresh_keeps_the_keyboards_place_and_the_scroll(page, demo):
    """The inbox refreshes itself every 10 s: a new run in doubt arrives under the runs root, the
    list is swapped, and the link the keyboard was on (and the page's scroll) stay where they were."""
    from evidence.ingest import importer

    join(User.objects.get(username="alice"), "confirmer")
    page.set_viewport_size({"width": 390, "height": 500})
    log_in(page)
    page.goto("/inbox/")
    investigate = page.locator("#inbox-list").get_by_role("link", name="Investigate")
    investigate.focus()
    page.keyboard.press("Tab")
    page.keyboard.press("Shift+Tab")  # the keyboard's own way there
    expect(investigate).to_be_focused()
    before = page.evaluate(KEEPS_FOCUS_AND_SCROLL)
    assert before[1] > 0, "the link is down the page: the scroll is tested too"

    shutil.copytree(demo / "send-message-killed", demo / "send-message-killed-again")
    importer.run_import(path=demo / "send-message-killed-again")
    expect(page.locator("#inbox-list")).to_contain_text("send-message-killed-again", timeout=25_000)

    assert page.evaluate(KEEPS_FOCUS_AND_SCROLL) == before
    expect(page.locator("#inbox-list").get_by_role("link", name="Investigate")).to_be_focused()
    page.keyboard.press("Enter")  # the same key still acts on it
    expect(page.get_by_role("region", name="Altered after it was written: investigate")).to_be_visible()


def test_the_live_run_page_keeps_the_keyboards_place(page, live_demo):
    """The run page refreshes itself every 3 s while its run is live: an event arrives, the body is
    swapped, and the focused link keeps the focus."""
    from evidence.ingest import importer
    from receipts import durable

    log_in(page)
    page.goto("/runs/send-message-killed/")
    replay = page.locator("#run-body").get_by_role("link", name="recovery decisions")
    replay.focus()
    expect(replay).to_be_focused()
    events = page.locator("#run-body dl.facts dd").nth(3)
    shown = events.inner_text()
    durable.append_event(live_demo / "send-message-killed", "note", {"text": "still at work"})
    importer.run_import(path=live_demo / "send-message-killed")
    expect(events).not_to_have_text(shown, timeout=15_000)
    expect(page.locator("#run-body").get_by_role("link", name="recovery decisions")).to_be_focused()
