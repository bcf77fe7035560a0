"""A person in a real browser: log in, filter, search, follow a call, watch a run live."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from evidence.ingest import importer
from evidence.models import Call
from receipts import durable
from tests.browser.conftest import log_in, screenshot
from tests.helpers import CONTRACT, import_as_seen_later, join
from tests.volume import synthetic_run

pytestmark = pytest.mark.browser


def test_login_then_the_runs_page(page):
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/accounts/login/"))
    screenshot(page, "login")
    log_in(page)
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    expect(page.locator("#runs-table tbody tr")).to_have_count(9)
    expect(page.get_by_text("5 need attention")).to_be_visible()
    screenshot(page, "runs")


def test_needs_attention_filter_swaps_the_table_in_place(page):
    log_in(page)
    page.get_by_label("Needs attention only").check()
    expect(page).to_have_url(re.compile(r"attention=1"))
    expect(page.locator("#runs-table tbody tr")).to_have_count(5)
    expect(page.locator("#runs-table")).not_to_contain_text("clean-run")
    page.get_by_label("State").select_option("running")  # the two killed calls wait at their attempt
    expect(page.locator("#runs-table tbody tr")).to_have_count(2)
    screenshot(page, "runs-filtered")


def test_search_a_call_id_prefix_and_follow_the_call(page):
    call = Call.objects.get(run__run_id="tampered-receipt")
    log_in(page)
    search = page.get_by_label("Find a run id, call_id prefix or client_submission_id")
    search.fill(call.call_id[:8])
    search.press("Enter")
    expect(page).to_have_url(re.compile(rf"/runs/tampered-receipt/calls/{call.call_id}/"))
    expect(page.get_by_role("heading", name="Identity check")).to_be_visible()
    expect(page.get_by_text("mismatch: the receipt was altered")).to_be_visible()
    screenshot(page, "call")
    page.get_by_role("navigation", name="Breadcrumb").get_by_role("link", name="tampered-receipt").click()
    expect(page.get_by_role("heading", name="Run tampered-receipt")).to_be_visible()


def test_live_refresh_shows_an_event_appended_while_the_page_is_open(page, live_demo):
    log_in(page)
    page.goto("/runs/send-message-killed/")
    expect(page.get_by_text("refreshing every 3 seconds while this tab is open")).to_be_visible()
    screenshot(page, "run-live-before")
    run_dir = live_demo / "send-message-killed"
    durable.append_event(run_dir, "note", {"text": "a new event, seen live"})
    importer.run_import(path=run_dir)
    expect(page.locator("#timeline")).to_contain_text("a new event, seen live", timeout=12_000)
    screenshot(page, "run-live-after")


def test_a_finished_run_does_not_poll(page):
    log_in(page)
    page.goto("/runs/clean-run/")
    expect(page.locator("#run-body")).not_to_have_attribute("hx-trigger", re.compile("every"))
    page.get_by_label("Event type").select_option("receipt")
    expect(page).to_have_url(re.compile(r"type=receipt"))
    expect(page.locator("#timeline tbody tr")).to_have_count(6)
    screenshot(page, "run")


@pytest.mark.parametrize(
    ("url", "name", "heading"),
    [
        ("/findings/", "findings", "Open findings"),
        ("/reservations/", "reservations", "Stale: reservations and calls"),
        ("/runs/send-message-killed/replay/", "replay", "Recovery decisions for send-message-killed"),
        ("/runs/conflict-same-id/", "run-conflict", "Run conflict-same-id"),
    ],
)
def test_every_page_renders(page, url, name, heading):
    log_in(page)
    page.goto(url)
    expect(page.get_by_role("heading", name=heading, exact=True)).to_be_visible()
    screenshot(page, name)


def test_dark_mode_and_keyboard(chromium, live_server, demo, django_user_model):
    join(django_user_model.objects.create_user("alice", password="a-long-password-1"), "viewer")
    context = chromium.new_context(
        color_scheme="dark", base_url=live_server.url, viewport={"width": 1400, "height": 900}
    )
    page = context.new_page()
    log_in(page)
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(13, 17, 23)"
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    screenshot(page, "runs-dark")
    context.close()


def test_a_long_ledger_pages_by_key_in_place(page, demo):
    synthetic_run(demo / "long-run", events=180, receipts=70, contract=CONTRACT)
    import_as_seen_later(demo)
    log_in(page)
    page.goto("/runs/long-run/")
    ledger = page.locator("#timeline")
    assert ledger.locator("tbody tr").first.locator("td").first.inner_text() == "180"
    ledger.get_by_role("link", name="Older →").click()
    expect(ledger.locator("tbody tr").first.locator("td").first).to_have_text("130")
    assert "page=after." in page.url, "the page's address is the cursor, so it can be shared and reloaded"
    ledger.get_by_role("link", name="Oldest »").click()
    expect(ledger.locator("tbody tr").last.locator("td").first).to_have_text("1")
    expect(ledger.get_by_text("50 shown of 180")).to_be_visible()
    page.get_by_label("From seq").fill("77")
    page.get_by_label("From seq").press("Enter")
    expect(ledger.locator("tbody tr").first.locator("td").first).to_have_text("77")
    page.goto("/runs/long-run/?calls_page=last#calls")
    calls = page.get_by_role("navigation", name="Call pages")
    # The last page is the last fifty; walking back, the first page holds what is left.
    expect(calls.get_by_text("50 shown of 70")).to_be_visible()
    calls.get_by_role("link", name="← Previous").click()
    calls = page.get_by_role("navigation", name="Call pages")
    expect(calls.get_by_text("20 shown of 70")).to_be_visible()
    expect(calls.get_by_role("link", name="← Previous")).to_have_count(0)
    screenshot(page, "run-paged")


def test_no_page_breaks_the_content_security_policy(page, demo):
    """Chromium reports every inline script or style, and every eval, that the policy refuses."""
    refused = []
    page.on(
        "console", lambda message: refused.append(message.text) if "Content Security Policy" in message.text else None
    )
    log_in(page)
    call = Call.objects.filter(run__run_id="send-message-killed").first()
    assert call is not None
    paths = ["/", "/inbox/", "/findings/", "/reservations/", "/audit/", "/retention/", "/runs/clean-run/",
             "/runs/clean-run/replay/", f"/runs/send-message-killed/calls/{call.call_id}/", "/search/?q=e"]  # fmt: skip
    for path in paths:
        page.goto(path)
        page.wait_for_load_state("networkidle")
    page.goto("/runs/clean-run/")
    page.get_by_label("Event type").select_option("receipt")  # an htmx swap
    expect(page.locator("#timeline tbody tr").first).to_contain_text("receipt")
    assert refused == []


def test_a_hidden_tab_does_not_poll(page, live_demo):
    log_in(page)
    page.goto("/runs/send-message-killed/")
    # The first poll comes 3 s after htmx starts; a loaded machine's timers run late, so the
    # test waits for it (up to 10 s) rather than for a fixed time (a CI run saw none in 3.5 s).
    with page.expect_request(lambda request: "send-message-killed" in request.url, timeout=10_000):
        pass
    polls = []
    page.on("request", lambda request: polls.append(request.url) if "send-message-killed" in request.url else None)
    page.evaluate("Object.defineProperty(document, 'visibilityState', {get: () => 'hidden'})")
    polls.clear()
    page.wait_for_timeout(7000)
    assert polls == [], "static/js/dashboard.js cancels the polls of a hidden tab"


def test_the_runs_list_and_the_inbox_page_by_key_in_place(page, demo, django_user_model):
    """Every list pages by key now; two of them walked in a browser, by htmx and by plain link."""
    for index in range(55):
        synthetic_run(demo / f"more-{index:02d}", events=3, receipts=1, contract=CONTRACT)
    import_as_seen_later(demo)
    log_in(page)
    pages = page.get_by_role("navigation", name="Run pages")
    expect(pages.get_by_text("50 shown of 64")).to_be_visible()
    first = page.locator("#runs-table tbody th").first.inner_text()
    pages.get_by_role("link", name="Next →").click()
    pages = page.get_by_role("navigation", name="Run pages")
    expect(pages.get_by_text("14 shown of 64")).to_be_visible()
    assert "page=after." in page.url and first not in page.locator("#runs-table tbody").inner_text()
    screenshot(page, "runs-paged")
    pages.get_by_role("link", name="← Previous").click()
    expect(page.locator("#runs-table tbody th").first).to_have_text(first)
    page.goto("/inbox/?severity=error")
    expect(page.get_by_role("heading", name="Inbox")).to_be_visible()
    screenshot(page, "inbox-errors")
