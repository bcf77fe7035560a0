"""The table of states in a real browser (issue 37): each state's glyph is drawn by the fonts a
page gets (a missing glyph shows as an empty box, which says nothing), and a call in doubt opens
with its state and what to do, in each language, on a phone's width."""

from __future__ import annotations

import pytest

from evidence.models import Call
from receipts import states
from tests.browser.conftest import log_in, screenshot

pytestmark = pytest.mark.browser

# Draw a text on a canvas in the badges' font and return its pixels: a glyph no font has is drawn
# as the same box as a private-use character, which no font has either.
PIXELS = r"""([text, font]) => {
    const canvas = document.createElement('canvas');
    canvas.width = 40; canvas.height = 40;
    const context = canvas.getContext('2d');
    context.font = font;
    context.fillText(text, 4, 30);
    return Array.from(context.getImageData(0, 0, 40, 40).data).join(',');
}"""


def test_every_states_glyph_is_drawn_not_a_box(page):
    log_in(page)
    page.goto("/inbox/")
    font = page.eval_on_selector(
        ".badge", "(el) => { const s = getComputedStyle(el); return s.fontWeight + ' 20px ' + s.fontFamily; }"
    )
    missing = page.evaluate(PIXELS, ["\ue000", font])
    empty = page.evaluate(PIXELS, [" ", font])
    for name, state in states.STATES.items():
        drawn = page.evaluate(PIXELS, [state.glyph, font])
        if drawn in (missing, empty):
            pytest.fail(f"{name}: its glyph {state.glyph!r} has no font on this page: it shows as a box")


@pytest.mark.parametrize(("language", "word"), [("en", "in doubt"), ("zh-hans", states.CHINESE["in doubt"])])
def test_a_call_in_doubt_opens_with_its_state_and_what_to_do(page, language, word):
    page.set_viewport_size({"width": 390, "height": 900})
    log_in(page)
    page.context.add_cookies([{"name": "callproof_language", "value": language, "url": page.url}])
    call = Call.objects.get(run__run_id="send-message-killed")
    page.goto(f"/runs/send-message-killed/calls/{call.call_id}/")
    line = page.locator(".state-line")
    first = line.locator("[data-state]").first
    assert first.get_attribute("data-state") == "in doubt"
    assert first.locator(".glyph").inner_text() == "?" and first.inner_text().strip().endswith(word)
    to_do = states.STATES["in doubt"].to_do("zh-Hans" if language == "zh-hans" else "en")
    assert line.locator(".to-do").inner_text().strip() == to_do
    box = line.bounding_box()
    assert box is not None and box["y"] + box["height"] <= 900, "the state and what to do, in the first screen"
    screenshot(page, f"call-in-doubt-state-{language}-390")
