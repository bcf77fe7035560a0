"""Every page at a phone's width and a laptop's: nothing scrolls sideways, and each is looked at."""

from __future__ import annotations

import pytest

from evidence.models import Call, Finding
from tests.browser.conftest import PASSWORD, screenshot
from tests.helpers import join

pytestmark = pytest.mark.browser

WIDTHS = (390, 1366)


def pages() -> list[tuple[str, str]]:
    doubt = Call.objects.get(run__run_id="send-message-killed").call_id
    tampered = Call.objects.get(run__run_id="tampered-receipt").call_id
    return [
        ("inbox", "/inbox/"),
        ("runs", "/"),
        ("run", "/runs/conflict-same-id/"),
        ("call-in-doubt", f"/runs/send-message-killed/calls/{doubt}/"),
        ("call-tampered", f"/runs/tampered-receipt/calls/{tampered}/"),
        ("replay", "/runs/stale-reservation/replay/"),
        ("findings", "/findings/"),
        ("stale", "/reservations/"),
        ("triage", f"/findings/{Finding.objects.get(code='submission_conflict').pk}/triage/"),
        ("audit", "/audit/"),
        ("retention", "/retention/"),
        ("hosts", "/hosts/"),
        ("search", "/search/?q="),
        ("not-found", "/runs/no-such-run/"),
        ("bad-request", "/findings/?code=nonsense"),
    ]


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_fits_the_width_of_the_screen(chromium, live_server, demo, django_user_model, width):
    join(django_user_model.objects.create_user("alice", password=PASSWORD), "viewer")
    context = chromium.new_context(viewport={"width": width, "height": 900}, base_url=live_server.url)
    page = context.new_page()
    page.goto("/accounts/login/")
    page.get_by_label("User name").fill("alice")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/")
    overflowing = []
    for name, url in pages():
        page.goto(url)
        if page.evaluate("document.documentElement.scrollWidth") > width:
            overflowing.append(name)
        screenshot(page, f"{width}-{name}")
    context.close()
    assert overflowing == [], f"these pages scroll sideways at {width} px"
