"""Playwright driving Debian's Chromium (never a downloaded browser) against a live server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from tests.helpers import import_as_seen_later, join

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"
# Screenshots are for a person to look at (docs/testing.md, "Looking at the pages"): they assert
# nothing, and CI throws its copy away, so only a run that asks for them (`make screenshots`)
# spends the time (about 250 full pages, PNG-encoded).
SCREENSHOTS_WANTED = os.environ.get("CALLPROOF_SCREENSHOTS") == "1"
PASSWORD = "a-long-password-1"
# Chromium's own background traffic would only meet this machine's closed network.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]  # fmt: skip


@pytest.fixture(scope="module")
def chromium():
    if not CHROMIUM.exists():
        pytest.fail("Debian's Chromium is missing: `make test` installs it (apt-get install chromium)")
    # Playwright's sync API keeps an event loop in this thread, which Django takes
    # for async code; the tests' own ORM calls are plain synchronous ones.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def demo(demo_root, transactional_db) -> Path:
    import_as_seen_later(demo_root)
    return demo_root


@pytest.fixture
def page(chromium, live_server, demo, django_user_model):
    join(django_user_model.objects.create_user("alice", password=PASSWORD), "viewer")
    context = chromium.new_context(viewport={"width": 1400, "height": 900}, base_url=live_server.url)
    context.set_default_timeout(10_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def live_demo(demo) -> Path:
    """The demo, with send-message-killed writing just now: a run is live (its page refreshes)
    only while its last event is recent, and the demo runs are written once a session, which
    on a slow machine is longer ago than that."""
    from evidence.ingest import importer
    from receipts import durable

    run_dir = demo / "send-message-killed"
    durable.append_event(run_dir, "note", {"text": "the runtime is still at work"})
    importer.run_import(path=run_dir)
    return demo


def log_in(page) -> None:
    page.goto("/")
    page.get_by_label("User name").fill("alice")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/")


def screenshot(page_or_part, name: str) -> None:
    """``tests/browser/screenshots/NAME.png``: a whole page, or one part of it (a locator)."""
    if not SCREENSHOTS_WANTED:
        return
    SCREENSHOTS.mkdir(exist_ok=True)
    options = {"full_page": True} if hasattr(page_or_part, "goto") else {}
    page_or_part.screenshot(path=str(SCREENSHOTS / f"{name}.png"), **options)
