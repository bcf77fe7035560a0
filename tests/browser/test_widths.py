"""Every page at a phone's width and a laptop's: nothing scrolls sideways, and each is looked at."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User

from evidence.ingest import importer
from evidence.models import Call, Finding, HumanDecision, Run
from evidence.review import settle
from receipts import durable
from tests.browser.conftest import PASSWORD, log_in
from tests.helpers import join

pytestmark = pytest.mark.browser

WIDTHS = (390, 1366)


def settled_call() -> Call:
    """write-file-killed's call, settled by a person (so that a settled call is among the pages)."""
    call = Call.objects.get(run__run_id="write-file-killed")
    if not HumanDecision.objects.filter(run=call.run, call_id=call.call_id).exists():
        person = join(User.objects.get_or_create(username="settler")[0], "confirmer")
        settle.settle_call(
            run=call.run, call=call, user=person, resolution="committed", reason="the file is there",
            typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256, confirm_queryable=True,
        )  # fmt: skip
    return call


def live_run() -> str:
    """send-message-killed, with an event written just now so that its page refreshes itself."""
    run = Run.objects.get(run_id="send-message-killed")
    durable.append_event(Path(run.path), "note", {"text": "written while the pages are looked at"})
    importer.run_import(path=Path(run.path))
    return run.run_id


def pages() -> list[tuple[str, str]]:
    doubt = Call.objects.get(run__run_id="send-message-killed").call_id
    tampered = Call.objects.get(run__run_id="tampered-receipt").call_id
    settled = settled_call().call_id
    return [
        ("inbox", "/inbox/"),
        ("runs", "/"),
        ("run", "/runs/conflict-same-id/"),
        ("run-live", f"/runs/{live_run()}/"),
        ("call-in-doubt", f"/runs/send-message-killed/calls/{doubt}/"),
        ("call-settled", f"/runs/write-file-killed/calls/{settled}/"),
        ("call-tampered", f"/runs/tampered-receipt/calls/{tampered}/"),
        ("replay", "/runs/stale-reservation/replay/"),
        ("replay-calls", "/runs/tampered-receipt/replay/"),
        ("findings", "/findings/"),
        ("stale", "/reservations/"),
        ("triage", f"/findings/{Finding.objects.get(code='submission_conflict').pk}/triage/"),
        ("audit", "/audit/"),
        ("retention", "/retention/"),
        ("hosts", "/hosts/"),
        ("search", "/search/?q="),
        ("not-found", "/runs/no-such-run/"),
        ("bad-request", "/findings/?code=nonsense"),
        ("exports", "/runs/clean-run/exports/"),
        ("no-evidence", "/runs/clean-run/evidence.zip"),
        ("api-docs", "/api/docs"),
    ]


# Each list's columns a person acts on; at a phone's width they must be on the screen, not past
# its right edge in a box that scrolls sideways.
KEY_COLUMNS = {
    "/": ("Run", "Verdict", "Calls by status", "In doubt", "Stale reservations", "Open findings"),
    "/inbox/": ("Severity", "What", "Run", "Next"),
    "/findings/": ("Code", "Run", "Subject", "Detail"),
    "/reservations/": ("Kind", "Run", "Subject", "State", "A resume would"),
}
CELLS_OFF_SCREEN = r"""names => {
  const off = [];
  let tables = 0;
  for (const table of document.querySelectorAll("table.data")) {
    const heads = [...table.querySelectorAll("thead th")].map(th => th.textContent.trim());
    if (!names.every(name => heads.includes(name))) continue;
    tables += 1;
    for (const row of table.querySelectorAll("tbody tr")) {
      if (row.children.length !== heads.length) continue;  // "None." across the table
      for (const name of names) {
        const box = row.children[heads.indexOf(name)].getBoundingClientRect();
        if (box.width === 0 || box.left < 0 || box.right > document.documentElement.clientWidth) {
          const what = row.textContent.trim().split(/\s+/).slice(0, 3).join(" ");
          off.push(`${name} of "${what}" at ${Math.round(box.left)}..${Math.round(box.right)}`);
        }
      }
    }
  }
  return [tables, off];
}"""


def test_at_a_phones_width_each_lists_key_columns_are_on_the_screen(chromium, live_server, demo, django_user_model):
    join(django_user_model.objects.create_user("alice", password=PASSWORD), "viewer")
    context = chromium.new_context(viewport={"width": 390, "height": 844}, base_url=live_server.url)
    page = context.new_page()
    log_in(page)
    off_screen = {}
    for url, names in KEY_COLUMNS.items():
        page.goto(url)
        tables, off = page.evaluate(CELLS_OFF_SCREEN, list(names))
        assert tables, f"no list on {url} has the columns {names}"
        off_screen[url] = off
    page.goto("/inbox/")
    settle = page.get_by_role("link", name="Settle").first.bounding_box()
    context.close()
    assert off_screen == {url: [] for url in KEY_COLUMNS}
    assert settle is not None and settle["x"] >= 0 and settle["x"] + settle["width"] <= 390


# WCAG 2.2's 2.5.8 (target size, minimum): each target is at least 24 by 24 CSS px, or its 24 px
# circle (centred on its box) meets no other target and no other small target's circle (the
# spacing exception). A control's label is part of its target: a click on it acts on the control.
SMALL_TARGETS = r"""() => {
  const MIN = 24, EPSILON = 0.01;
  const boxOf = (element) => {
    const boxes = [element, ...(element.labels || [])].map((e) => e.getBoundingClientRect())
      .filter((b) => b.width && b.height);
    if (!boxes.length) return null;
    const left = Math.min(...boxes.map((b) => b.left)), top = Math.min(...boxes.map((b) => b.top));
    const right = Math.max(...boxes.map((b) => b.right)), bottom = Math.max(...boxes.map((b) => b.bottom));
    return { left, top, right, bottom, width: right - left, height: bottom - top,
             x: (left + right) / 2, y: (top + bottom) / 2 };
  };
  const selector = "a[href], button, input:not([type=hidden]), select, textarea, summary";
  const targets = [];
  for (const element of document.querySelectorAll(selector)) {
    const style = getComputedStyle(element);
    if (style.visibility === "hidden" || element.closest(".visually-hidden")) continue;
    const box = boxOf(element);
    if (!box || box.right <= 0 || box.bottom + scrollY <= 0) continue;  // not drawn, or the skip link off-screen
    targets.push({ element, box, small: box.width < MIN - EPSILON || box.height < MIN - EPSILON });
  }
  const distanceToBox = (x, y, b) => Math.hypot(Math.max(b.left - x, 0, x - b.right),
                                                Math.max(b.top - y, 0, y - b.bottom));
  const failing = [];
  for (const target of targets.filter((t) => t.small)) {
    const crowded = targets.some((other) => other !== target && other.element !== target.element && (
      distanceToBox(target.box.x, target.box.y, other.box) < MIN / 2 - EPSILON
      || (other.small && Math.hypot(target.box.x - other.box.x, target.box.y - other.box.y) < MIN - EPSILON)));
    if (crowded) {
      const element = target.element, box = target.box;
      const name = (element.textContent.trim() || element.name || "").slice(0, 30);
      failing.push(`${element.tagName.toLowerCase()} "${name}" ${Math.round(box.width)}x${Math.round(box.height)}`);
    }
  }
  return [failing, targets.filter((t) => t.small).length];
}"""


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_at_a_phones_width_every_target_is_24_px_or_spaced_apart(
    chromium, live_server, demo, django_user_model, language
):
    join(django_user_model.objects.create_user("alice", password=PASSWORD), "viewer", "confirmer")
    context = chromium.new_context(viewport={"width": 390, "height": 844}, base_url=live_server.url)
    context.add_cookies([{"name": "callproof_language", "value": language, "url": live_server.url}])
    page = context.new_page()
    page.goto("/accounts/login/")
    small, under = {}, {}
    small["login"], under["login"] = page.evaluate(SMALL_TARGETS)
    page.locator("#id_username").fill("alice")
    page.locator("#id_password").fill(PASSWORD)
    page.locator("#id_password").press("Enter")
    page.wait_for_url("**/")
    for name, url in pages():
        page.goto(url)
        small[name], under[name] = page.evaluate(SMALL_TARGETS)
    context.close()
    print(f"targets under 24 px at 390 ({language}), spaced apart or not: {under}")
    assert {name: found for name, found in small.items() if found} == {}
