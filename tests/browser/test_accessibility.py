"""axe-core (shipped inside axe-playwright-python: nothing downloaded) over every page, at a
phone's width and a laptop's, in light and dark: zero violations of any impact; and a focus
ring on whatever has the keyboard."""

from __future__ import annotations

import pytest
from axe_playwright_python.base import AxeResults
from axe_playwright_python.sync_playwright import Axe

from evidence.models import Call
from tests.browser.conftest import PASSWORD, log_in, screenshot
from tests.browser.test_widths import pages
from tests.helpers import join

pytestmark = pytest.mark.browser
AXE = Axe()


def logged_in(chromium, live_server, username: str, width: int, scheme: str):
    context = chromium.new_context(
        viewport={"width": width, "height": 900}, color_scheme=scheme, base_url=live_server.url, bypass_csp=True
    )
    page = context.new_page()
    page.goto("/accounts/login/")
    login = AXE.run(page)
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/")
    return context, page, login


# A phone's width and a laptop's, each in light and dark: every page is checked four times, its
# viewport and colour scheme changed in place (the layout and the colours follow at once) rather
# than loaded again for each.
VIEWS = [(width, scheme) for width in (390, 1366) for scheme in ("light", "dark")]


def checked_in_every_view(page) -> list[tuple[str, AxeResults]]:
    results = []
    for width, scheme in VIEWS:
        page.set_viewport_size({"width": width, "height": 900})
        page.emulate_media(color_scheme=scheme)
        results.append((f"{width} px, {scheme}", AXE.run(page)))
    return results


def test_no_page_has_an_accessibility_violation(chromium, live_server, demo, django_user_model):
    # Every role, so that every form and action of each page is there to be checked.
    join(django_user_model.objects.create_user("alice", password=PASSWORD), "viewer", "confirmer", "exporter", "admin")
    django_user_model.objects.create_user("newcomer", password=PASSWORD)
    context = chromium.new_context(base_url=live_server.url, bypass_csp=True)
    page = context.new_page()
    page.goto("/accounts/login/")
    checked = [("login", checked_in_every_view(page))]
    page.get_by_label("User name").fill("alice")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/")
    for name, url in pages():
        page.goto(url)
        checked.append((name, checked_in_every_view(page)))
        for width in (390, 1366):  # the light ones are test_languages.py's
            page.set_viewport_size({"width": width, "height": 900})
            page.emulate_media(color_scheme="dark")
            screenshot(page, f"dark-{width}-{name}")
    # A refused settle: its error summary, and each field marked invalid beside its message.
    page.goto(f"/runs/send-message-killed/calls/{Call.objects.get(run__run_id='send-message-killed').call_id}/")
    page.get_by_role("button", name="Settle this call").click()
    page.get_by_role("alert").wait_for()
    checked.append(("call-refused", checked_in_every_view(page)))
    context.close()
    context, page, _ = logged_in(chromium, live_server, "newcomer", 1366, "light")
    assert page.get_by_role("heading", name="You have no role yet").is_visible()
    checked.append(("no-role", checked_in_every_view(page)))
    context.close()
    found: dict[str, list[str]] = {}
    for name, views in checked:
        for view, results in views:
            for violation in results.response["violations"]:
                targets = [node["target"] for node in violation["nodes"]][:3]
                found.setdefault(f"{name} at {view}", []).append(
                    f"{violation['id']} ({violation['impact']}): {targets}"
                )
    assert found == {}, f"axe-core: {found}"


def luminance(rgb: str) -> float:
    """WCAG relative luminance of a computed colour (``rgb(r, g, b)`` or ``rgba(...)``)."""
    channels = [int(float(c)) / 255 for c in rgb[rgb.index("(") + 1 : rgb.index(")")].split(",")[:3]]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


FOCUSABLE = {
    "the reason textarea": "form.settle textarea",
    "a radio button": "form.settle input[type=radio]",
    "a text field": "form.settle input[type=text]",
    "the settle button": "form.settle button",
    "a link": "main a",
    "a disclosure": "details summary",
    "the search field": "#site-search",
}


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_whatever_has_the_keyboard_shows_a_ring_that_stands_out(chromium, live_server, demo, django_user_model, scheme):
    """A 2 px solid ring at 3:1 against the page (WCAG 2.4.7 and 1.4.11), on each kind of control."""
    join(django_user_model.objects.create_user("alice", password=PASSWORD), "viewer", "confirmer")
    context, page, _ = logged_in(chromium, live_server, "alice", 1366, scheme)
    call = Call.objects.get(run__run_id="send-message-killed").call_id
    page.goto(f"/runs/send-message-killed/calls/{call}/")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    rings = {}
    for name, selector in FOCUSABLE.items():
        element = page.locator(selector).first
        element.focus()
        page.keyboard.press("Shift")  # a key pressed: the browser's focus is the keyboard's
        rings[name] = element.evaluate(
            "e => e.matches(':focus-visible') && [getComputedStyle(e).outlineStyle, "
            "parseFloat(getComputedStyle(e).outlineWidth), getComputedStyle(e).outlineColor]"
        )
    context.close()
    for name, ring in rings.items():
        assert ring, f"{name} did not take the keyboard's focus"
        style, width, colour = ring
        assert (style, width >= 2) == ("solid", True), f"{name} in {scheme}: outline {ring}"
        assert contrast(colour, background) >= 3, f"{name} in {scheme}: ring {colour} on {background}"


def test_badges_legends_and_rows_needing_attention_are_told_without_colour(page, demo):
    """Under greyscale the badges' tints, the legend's swatches and the attention rows' tint
    are all grey: each kind also has a shape of its own."""
    log_in(page)
    page.goto("/")
    marks = page.evaluate("""() => {
      const before = e => getComputedStyle(e, "::before").content;
      const badges = {};
      // A state (receipts/states.py) wears its own glyph in the page; other badges their kind's mark.
      for (const e of document.querySelectorAll(".badge")) {
        const glyph = e.querySelector(".glyph");
        const name = e.dataset.state ? "state " + e.dataset.state : [...e.classList].join(" ");
        badges[name] = glyph ? glyph.textContent : before(e);
      }
      return {
        badges,
        legend: [...document.querySelectorAll(".legend-item svg")].map(e => e.innerHTML),
        attention: [...document.querySelectorAll("tr.attention > th")].map(before),
        others: [...document.querySelectorAll("tbody tr:not(.attention) > th")].map(before),
      };
    }""")
    shapes = marks["badges"]
    assert {"badge badge-warn", "badge badge-bad", "state in doubt"} <= set(shapes), shapes
    assert "none" not in shapes.values() and "" not in shapes.values(), shapes
    assert len(set(shapes.values())) == len(shapes), f"two kinds of badge share a shape: {shapes}"
    legend = marks["legend"]
    assert len(legend) == 7 and len(set(legend)) == 7, "each call state's swatch is drawn as the bar draws it"
    assert marks["attention"] and set(marks["attention"]) != {"none"} and set(marks["others"]) == {"none"}
