"""The exported evidence page, opened from disk in a real browser: it asks the network for nothing."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from playwright.sync_api import expect

from tests.browser.conftest import screenshot

pytestmark = pytest.mark.browser


def test_the_evidence_page_makes_no_request_and_reads_as_a_report(chromium, demo, tmp_path):
    out = tmp_path / "export"
    call_command("export_evidence", "tampered-receipt", "--out", str(out))
    context = chromium.new_context(viewport={"width": 1100, "height": 900})
    page = context.new_page()
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto((out / "index.html").as_uri())
    expect(page.get_by_role("heading", name="Evidence of run tampered-receipt")).to_be_visible()
    expect(page.locator("body")).to_contain_text("How to check this evidence")
    expect(page.locator("body")).to_contain_text("tampered")
    screenshot(page, "evidence-page")
    page.emulate_media(media="print")
    screenshot(page, "evidence-page-print")
    context.close()
    assert requests == [(out / "index.html").as_uri()], "the page loads nothing but itself"
