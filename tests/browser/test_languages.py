"""Every page in English and in Chinese, at a phone's width and a laptop's, in a real browser:
each is looked at (screenshots), nothing scrolls sideways, no button, badge, tab or column
heading breaks over two lines, and a Chinese page holds no English interface text once its
scripts have run. The switcher is clicked as a person would, and remembered."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import PASSWORD, screenshot
from tests.browser.test_widths import WIDTHS, pages
from tests.helpers import join
from tests.i18n_check import english_on

pytestmark = pytest.mark.browser

# The browser's own language, as a person's machine would send it (Accept-Language).
LOCALES = {"en": "en-US", "zh": "zh-CN"}

# Elements whose text is one short label: breaking one over two lines is a bad wrap.
# A column heading or an action link with no space in it too (Chinese breaks anywhere); a row
# heading is data (a run id), which may break at its hyphens.
ONE_LINE = "button, .badge, header.site nav a, thead th, .triage-link"
BROKEN_LABELS = r"""(selector) => [...document.querySelectorAll(selector)].filter((el) => {
    const style = getComputedStyle(el);
    if (style.display === 'none' || !el.offsetParent || !el.textContent.trim()) return false;
    if (el.closest('#swagger-ui')) return false;  // Swagger UI's operation rows: a path and its summary, not a label
    if (el.matches('th, .triage-link') && /\s/.test(el.textContent.trim())) return false;
    const head = el.closest('thead');  // a phone's cards keep the header row for screen readers only
    if (head && getComputedStyle(head).position === 'absolute') return false;
    // The text's own height, not the box's: a table cell is as tall as its row.
    const text = document.createRange();
    text.selectNodeContents(el);
    const line = parseFloat(style.lineHeight) || parseFloat(style.fontSize) * 1.4;
    return text.getBoundingClientRect().height > line * 1.6;
}).map((el) => el.tagName.toLowerCase() + ': ' + el.textContent.trim().slice(0, 40))"""


def logged_in(chromium, live_server, language: str, width: int):
    context = chromium.new_context(
        viewport={"width": width, "height": 900}, base_url=live_server.url, locale=LOCALES[language]
    )
    context.set_default_timeout(10_000)
    page = context.new_page()
    page.goto("/accounts/login/")
    screenshot(page, f"{language}-{width}-login")
    page.locator("#id_username").fill("alice")
    page.locator("#id_password").fill(PASSWORD)
    page.locator("form:has(#id_password) button[type=submit]").click()
    page.wait_for_url("**/")
    return context, page


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("language", ["en", "zh"])
def test_every_page_in_each_language_fits_and_reads_whole(
    chromium, live_server, demo, django_user_model, language, width
):
    join(django_user_model.objects.create_user("alice", password=PASSWORD), "viewer", "confirmer", "exporter", "admin")
    context, page = logged_in(chromium, live_server, language, width)
    problems: dict[str, list[str]] = {}
    for name, url in pages():
        page.goto(url)
        found = []
        if page.evaluate("document.documentElement.scrollWidth") > width:
            found.append("scrolls sideways")
        found += [f"two lines: {label}" for label in page.evaluate(BROKEN_LABELS, ONE_LINE)]
        # The API docs are Swagger UI's, which speaks English, as the API does (docs/glossary.md).
        if language == "zh" and name != "api-docs":
            found += [f"English: {text}" for text in english_on(page.content())]
        if found:
            problems[name] = found
        screenshot(page, f"{language}-{width}-{name}")
    context.close()
    assert problems == {}, "\n".join(f"{name}: {found}" for name, found in problems.items())


def test_a_person_switches_language_and_it_is_remembered(chromium, live_server, demo, django_user_model):
    join(django_user_model.objects.create_user("alice", password=PASSWORD), "viewer")
    context, page = logged_in(chromium, live_server, "zh", 1366)
    expect(page.locator("html")).to_have_attribute("lang", "zh-Hans")
    expect(page.get_by_role("navigation", name="主导航")).to_be_visible()
    page.goto("/findings/")
    page.get_by_role("button", name="English").click()
    page.wait_for_url("**/findings/")
    expect(page.locator("html")).to_have_attribute("lang", "en")
    expect(page.get_by_role("link", name="Findings", exact=True)).to_be_visible()
    expect(page.get_by_role("button", name="English")).to_be_disabled()
    # Remembered over what the browser asks for, page after page, and after logging in again.
    page.goto("/inbox/")
    expect(page.locator("html")).to_have_attribute("lang", "en")
    page.get_by_role("button", name="Log out").click()
    expect(page.locator("html")).to_have_attribute("lang", "en")
    page.get_by_role("button", name="简体中文").click()
    expect(page.locator("html")).to_have_attribute("lang", "zh-Hans")
    context.close()
