"""Issue 37's dead ends, in a real Chromium: each page a person can land on says what to do next,
and every time is in the reader's own time zone, UTC in its tooltip."""

from __future__ import annotations

import datetime as dt
import re
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from evidence.models import Call
from evidence.review.inbox import inbox_total
from tests.browser.conftest import PASSWORD, log_in, screenshot
from tests.helpers import join

pytestmark = pytest.mark.browser


def test_the_evidence_link_before_any_export_leads_to_the_exports_panel(page, demo):
    join(User.objects.get(username="alice"), "exporter")
    log_in(page)
    response = page.goto("/runs/clean-run/evidence.zip")
    assert response is not None and response.status == 404
    expect(page.get_by_role("heading", name="No evidence ready yet")).to_be_visible()
    screenshot(page, "dead-ends-no-evidence")
    page.get_by_role("link", name="the run's page").click()
    expect(page.get_by_role("button", name="Export the redacted evidence")).to_be_visible()


def test_the_exports_panel_opened_as_an_address_is_a_page_with_the_site_around_it(page, demo):
    join(User.objects.get(username="alice"), "exporter")
    log_in(page)
    page.goto("/runs/clean-run/exports/")
    expect(page.get_by_role("heading", name="Exports of clean-run")).to_be_visible()
    expect(page.get_by_role("navigation", name="Main")).to_be_visible()
    expect(page.get_by_role("button", name="Export the redacted evidence")).to_be_visible()
    screenshot(page, "dead-ends-exports-page")


def test_not_allowed_names_the_role_and_who_gives_it(page, demo, django_user_model):
    join(django_user_model.objects.create_user("ada", email="ada@example.com"), "admin")
    log_in(page)
    page.goto("/runs/clean-run/exports/")
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
    expect(page.locator("main")).to_contain_text("it needs the exporter role")
    expect(page.get_by_role("link", name="ada@example.com")).to_be_visible()


def test_a_filtered_empty_inbox_says_how_many_wait_and_clears_the_filter(page, demo):
    log_in(page)
    page.goto("/inbox/?run=clean-run")
    waiting = inbox_total()
    expect(page.locator("#inbox-list")).to_contain_text(f"Nothing of this kind; {waiting} items need a person in all.")
    page.get_by_role("link", name="Show every open item").click()
    expect(page.locator("#inbox-list tbody tr")).to_have_count(waiting)


def test_the_inbox_says_how_to_resume_and_the_call_page_gives_the_command(page, demo):
    log_in(page)
    page.goto("/inbox/")
    page.locator("#inbox-list tbody tr", has_text="write-file-killed").get_by_role("link", name="How to resume").click()
    how = page.locator("#resume-how")
    expect(how).to_be_visible()
    expect(how.locator("code.command")).to_contain_text("python -m receipts call")
    expect(how.locator("code.command")).to_contain_text("--tool write_file --attempt 1 --args")


def test_the_stale_page_offers_to_settle_a_stale_call_in_doubt(page, demo):
    log_in(page)
    page.goto("/reservations/")
    row = page.locator("tbody tr", has_text="send-message-killed")
    row.get_by_role("link", name="Settle the call").click()
    expect(page.get_by_role("heading", name=re.compile("Call"))).to_be_visible()
    assert "/runs/send-message-killed/calls/" in page.url


@pytest.mark.parametrize(("zone", "language"), [("Asia/Shanghai", "en"), ("America/New_York", "zh-hans")])
def test_times_are_in_the_readers_zone_with_utc_in_the_tooltip(
    chromium, live_server, demo, django_user_model, zone, language
):
    join(django_user_model.objects.create_user("alice", password=PASSWORD), "viewer")
    context = chromium.new_context(base_url=live_server.url, timezone_id=zone)
    context.add_cookies([{"name": "callproof_language", "value": language, "url": live_server.url}])
    page = context.new_page()
    page.goto("/accounts/login/")
    page.locator("#id_username").fill("alice")
    page.locator("#id_password").fill(PASSWORD)
    page.locator("form button[type=submit]").last.click()
    page.wait_for_url("**/")
    call = Call.objects.get(run__run_id="send-message-killed")
    page.goto(f"/runs/send-message-killed/calls/{call.call_id}/")
    shown = page.locator("time[data-local]").first
    instant = dt.datetime.fromisoformat(shown.get_attribute("datetime").replace("Z", "+00:00"))
    local = instant.astimezone(ZoneInfo(zone))
    utc = instant.astimezone(dt.UTC)
    if language == "en":
        expected = f"{local:%Y-%m-%d %H:%M:%S} GMT+8"
        tooltip = f"{utc:%Y-%m-%d %H:%M:%S} UTC"
    else:
        expected = f"{local.year}年{local.month}月{local.day}日 {local:%H:%M:%S} "
        tooltip = f"{utc.year}年{utc.month}月{utc.day}日 {utc:%H:%M:%S} UTC"
    expect(shown).to_contain_text(expected)
    assert shown.get_attribute("title") == tooltip
    screenshot(page, f"dead-ends-times-{zone.replace('/', '-')}")
    context.close()


def test_the_api_docs_render_every_operation_from_our_own_files(page, demo, live_server):
    outside: list[str] = []
    refused: list[str] = []
    page.on(
        "request", lambda request: outside.append(request.url) if not request.url.startswith(live_server.url) else None
    )
    page.on(
        "console", lambda message: refused.append(message.text) if "Content Security Policy" in message.text else None
    )
    log_in(page)
    page.goto("/api/docs")
    expect(page.get_by_role("heading", name="The JSON API")).to_be_visible()
    operations = page.locator("#swagger-ui .opblock")
    expect(operations.first).to_be_visible()
    from evidence.web.api import api

    described = api.get_openapi_schema()["paths"]
    expect(operations).to_have_count(sum(len(methods) for methods in described.values()))
    expect(page.locator("#swagger-ui")).to_contain_text("/api/runs")
    screenshot(page, "dead-ends-api-docs")
    assert outside == [] and refused == []


def test_search_finds_the_call_that_wrote_to_a_recipient(page, demo):
    log_in(page)
    page.locator("#site-search").fill("customer@example.com")
    page.get_by_role("button", name="Find").click()
    call = Call.objects.get(run__run_id="send-message-killed")
    page.wait_for_url(f"**/runs/send-message-killed/calls/{call.call_id}/")
    expect(page.locator("main")).to_contain_text("customer@example.com")
