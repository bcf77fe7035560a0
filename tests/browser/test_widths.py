"""Every page at a phone's width and a laptop's: nothing scrolls sideways, and each is looked at."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User

from evidence import importer, settle
from evidence.models import Call, Finding, HumanDecision, Run
from receipts import durable
from tests.browser.conftest import PASSWORD, log_in, screenshot
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


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_fits_the_width_of_the_screen(chromium, live_server, demo, django_user_model, width):
    join(django_user_model.objects.create_user("alice", password=PASSWORD), "viewer")
    context = chromium.new_context(viewport={"width": width, "height": 900}, base_url=live_server.url)
    page = context.new_page()
    log_in(page)
    overflowing = []
    for name, url in pages():
        page.goto(url)
        if page.evaluate("document.documentElement.scrollWidth") > width:
            overflowing.append(name)
        screenshot(page, f"{width}-{name}")
    context.close()
    assert overflowing == [], f"these pages scroll sideways at {width} px"


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
