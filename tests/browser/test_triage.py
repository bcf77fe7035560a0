"""An operator triages from the inbox: a conflict snoozed until it changes leaves, and comes back
when the runtime writes a new conflict into the run and it is imported again; a stale reservation
acknowledged leaves, and comes back when the acknowledgement is undone."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from evidence.ingest import importer
from evidence.models import Finding
from receipts import runtime
from receipts.demo import login_request
from tests.browser.conftest import log_in, screenshot
from tests.helpers import join

pytestmark = pytest.mark.browser


def triage_from_the_inbox(page, run_id: str, reason: str, button: str) -> None:
    page.locator("#inbox-list tbody tr", has_text=run_id).get_by_role("link", name="Acknowledge or snooze").click()
    expect(page.get_by_role("heading", name="Triage a finding")).to_be_visible()
    page.get_by_label("Reason").fill(reason)
    page.get_by_role("button", name=button, exact=True).click()
    page.wait_for_url(re.compile(r".*/inbox/.*"))


def test_an_operator_snoozes_and_acknowledges_from_the_inbox_and_sees_items_leave_and_come_back(page, demo):
    join(User.objects.get(username="alice"), "confirmer")
    log_in(page)
    page.goto("/inbox/")
    count, items = page.locator("header .count"), page.locator("#inbox-list tbody")
    expect(count).to_have_text("5")

    # A conflict, snoozed until it changes (the form's default).
    triage_from_the_inbox(page, "conflict-same-id", "the client retries: wait for the next", "Snooze")
    expect(page.get_by_role("status")).to_contain_text("Snoozed")
    expect(items).not_to_contain_text("conflict-same-id")
    expect(count).to_have_text("4")

    # A stale reservation, acknowledged.
    triage_from_the_inbox(page, "stale-reservation", "the owner knows: ticket OPS-12", "Acknowledge")
    expect(items).not_to_contain_text("stale-reservation")
    expect(count).to_have_text("3")

    page.get_by_label("Triage").select_option("acknowledged")
    expect(items).to_contain_text("acknowledged by alice")
    expect(items).to_contain_text("the owner knows: ticket OPS-12")
    page.get_by_label("Triage").select_option("snoozed")
    expect(items).to_contain_text("until it changes")
    screenshot(page, "triage-inbox-snoozed")

    # The runtime resumes the conflict run and sends the same id a third request; the next import sees it.
    run_dir = demo / "conflict-same-id"
    runtime.run_set_state(run_dir, state="retrying", attempts=2)
    runtime.write_task(run_dir, login_request(recipient="SEC", subject="Rotate keys"), "conflict-submission")
    importer.run_import(path=run_dir)
    page.goto("/inbox/")
    expect(items).to_contain_text("conflict-same-id")
    expect(count).to_have_text("4")

    # The acknowledgement undone, from the acknowledged list.
    page.goto("/inbox/?triage=acknowledged")
    items.locator("tr", has_text="stale-reservation").get_by_role("link", name="Undo the acknowledgement").click()
    page.get_by_label("Reason").fill("OPS-12 closed without a fix")
    page.get_by_role("button", name="Undo the acknowledgement").click()
    page.wait_for_url(re.compile(r".*/inbox/.*"))
    page.goto("/inbox/")
    expect(items).to_contain_text("stale-reservation")
    expect(count).to_have_text("5")


@pytest.mark.parametrize("width", [390, 1366])
def test_the_triaged_lists_at_a_phones_width_and_a_laptops(page, demo, width):
    join(User.objects.get(username="alice"), "confirmer")
    page.set_viewport_size({"width": width, "height": 900})
    log_in(page)
    page.goto("/inbox/")
    triage_from_the_inbox(page, "stale-reservation", "the owner knows: ticket OPS-12", "Acknowledge")
    page.goto("/inbox/")
    triage_from_the_inbox(page, "conflict-same-id", "wait for the next request", "Snooze")
    overflowing = []
    for name, url in (
        ("inbox-open", "/inbox/"),
        ("inbox-acknowledged", "/inbox/?triage=acknowledged"),
        ("inbox-snoozed", "/inbox/?triage=snoozed"),
        ("findings-snoozed", "/findings/?triage=snoozed"),
        ("findings-open", "/findings/"),
        ("stale-acknowledged", "/reservations/?triage=acknowledged"),
        ("stale-open", "/reservations/"),
        ("form", f"/findings/{Finding.objects.filter(code='stale_call').earliest('id').pk}/triage/"),
    ):
        page.goto(url)
        if page.evaluate("document.documentElement.scrollWidth") > width:
            overflowing.append(name)
        screenshot(page, f"triage-{width}-{name}")
    page.goto("/inbox/?triage=acknowledged")
    page.get_by_role("link", name="Undo the acknowledgement").click()
    page.get_by_role("button", name="Undo the acknowledgement").click()  # no reason: refused beside the field
    expect(page.locator("#reason-error")).to_contain_text("This field is required")
    screenshot(page, f"triage-{width}-error")
    assert overflowing == [], f"these pages scroll sideways at {width} px"
