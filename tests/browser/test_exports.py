"""An export asked for in a real browser: the panel waits for the worker, shows its progress, and
offers the zip when done; the worker is a real process on the live server's database."""

from __future__ import annotations

import os
import re
import signal
import zipfile

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from evidence.ingest import importer
from evidence.models import Export
from receipts.reader.verify import verify_export
from tests.browser.conftest import log_in, screenshot
from tests.helpers import CONTRACT, is_stopped, join, until
from tests.serving import stop
from tests.subprocess_db import start_worker, this_database_url
from tests.volume import synthetic_run

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_an_export_clicked_on_the_run_page_shows_its_progress_and_downloads(page, tmp_path, export_root):
    run_dir = tmp_path / "big" / "big-run"
    synthetic_run(run_dir, events=8_000, receipts=100, contract=CONTRACT)  # one progress report mid-way
    importer.run_import(path=run_dir)
    join(User.objects.get(username="alice"), "exporter")
    log_in(page)
    page.goto("/runs/big-run/")
    page.get_by_role("button", name="Export the redacted evidence").click()
    exports = page.get_by_role("list", name="Exports of this run")
    expect(exports).to_contain_text("waiting for the worker")

    # The worker stops itself (SIGSTOP) once it has saved its progress mid-way, so the page is seen
    # while the export runs, whatever the machine's speed.
    worker = start_worker(this_database_url(), tmp_path / "worker.log", EVIDENCE_EXPORT_ROOT=str(export_root),
                          RECEIPTS_FAILPOINT="export_mid_progress:pause")  # fmt: skip
    try:
        until(lambda: is_stopped(worker.pid), "the worker to pause mid-export", 300)
        assert Export.objects.filter(state=Export.RUNNING, done__gt=0).exists()
        progress = exports.locator("progress")
        expect(progress).to_be_visible()
        expect(exports).to_contain_text(re.compile(r"running \d+% [1-9][\d,]* of [\d,]+ rows"))  # the next poll
        assert 0 < int(progress.get_attribute("value") or 0) < int(progress.get_attribute("max") or 0)
        screenshot(page.locator(".overview"), "export-running")  # the facts: the page is a long ledger
        os.kill(worker.pid, signal.SIGCONT)
        link = exports.get_by_role("link", name="Download the redacted evidence")
        expect(link).to_be_visible(timeout=300_000)
    finally:
        os.kill(worker.pid, signal.SIGCONT)
        stop(worker)
    expect(page.locator("#exports")).not_to_have_attribute("hx-trigger", "every 1s")  # polling stopped
    screenshot(page.locator(".overview"), "export-done")
    with page.expect_download() as download:
        link.click()
    saved = tmp_path / download.value.suggested_filename
    download.value.save_as(saved)
    assert saved.name == "big-run-evidence.zip"
    with zipfile.ZipFile(saved) as bundle:
        bundle.extractall(tmp_path / "unzipped")
    assert verify_export(tmp_path / "unzipped" / "big-run-evidence", run_dir) == []
