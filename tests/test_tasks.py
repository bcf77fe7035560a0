"""Heavy work in the background (issue 21): an export asked for on the run page is queued by the
request and made by a real worker process (``manage.py db_worker``) on the same database; the
maintenance tasks do their work when a worker runs them. On SQLite and PostgreSQL alike."""

from __future__ import annotations

import datetime as dt
import io
import signal
import time
import zipfile
from http import HTTPStatus
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django_tasks_db.models import DBTaskResult

from evidence import maintenance
from evidence.export import jobs
from evidence.ingest import importer
from evidence.models import Export, Run
from receipts import protocol
from receipts.reader.verify import verify_export
from tests.helpers import CONTRACT, content, downloaded, is_stopped, join, until
from tests.i18n_check import english_on
from tests.serving import stop
from tests.subprocess_db import start_worker, this_database_url
from tests.test_operations import scrape
from tests.volume import synthetic_run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "a-long-password-1"


@pytest.fixture
def exporter(django_user_model):
    return join(django_user_model.objects.create_user("erin", password=PASSWORD), "exporter")


def files_under(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file()) if root.exists() else []


def unzip(data: bytes, into: Path) -> Path:
    with zipfile.ZipFile(io.BytesIO(data)) as bundle:
        [folder] = {name.split("/", 1)[0] for name in bundle.namelist()}
        bundle.extractall(into)
    return into / folder


def test_an_export_is_queued_at_once_made_by_the_worker_and_verifies(tmp_path, export_root, exporter, client):
    run_dir = tmp_path / "runs" / "big-run"
    # Past one progress report (bundle.PROGRESS_EVERY rows), short of two: the worker pauses once.
    synthetic_run(run_dir, events=8_000, receipts=100, contract=CONTRACT)
    importer.run_import(path=run_dir)
    run = Run.objects.get(run_id="big-run")
    assert run.event_count == 8_000
    client.force_login(exporter)

    started = time.perf_counter()
    response = client.post("/runs/big-run/export/")
    answered = time.perf_counter() - started
    assert response.status_code == HTTPStatus.SEE_OTHER and response["Location"] == "/runs/big-run/#exports"
    # Returned without building anything: the export waits for a worker, and no file exists yet.
    [export] = Export.objects.filter(run=run)
    assert export.state == Export.WAITING and export.done == 0 and export.path == ""
    assert DBTaskResult.objects.get(id=export.task_id).status == "READY"
    assert files_under(export_root) == []
    queue = scrape(client)
    assert queue[("callproof_tasks", (("state", "waiting"),))] == 1
    assert queue[("callproof_task_oldest_waiting_seconds", ())] >= 0
    page = content(client.get("/runs/big-run/"))
    assert "waiting</span> for the worker" in page and 'hx-trigger="every 1s"' in page

    worker = start_worker(this_database_url(), tmp_path / "worker.log", EVIDENCE_EXPORT_ROOT=str(export_root),
                          RECEIPTS_FAILPOINT="export_mid_progress:pause")  # fmt: skip
    try:
        # Stopped (SIGTERM, as systemd stops it) mid-export, the worker finishes the task, then exits:
        # the SIGTERM waits while the worker is paused after its first progress report.
        until(lambda: is_stopped(worker.pid), "the worker to pause mid-export", 300)
        assert Export.objects.get(pk=export.pk).state == Export.RUNNING
        worker.send_signal(signal.SIGTERM)
        worker.send_signal(signal.SIGCONT)
        assert worker.wait(timeout=600) == 0
    finally:
        stop(worker)
    export.refresh_from_db()
    assert export.state == Export.DONE, (export.error, (tmp_path / "worker.log").read_text()[-3000:])
    assert export.done == export.total >= 8_000 and export.percent == 100
    assert DBTaskResult.objects.get(id=export.task_id).status == "SUCCESSFUL"
    queue = scrape(client)
    assert queue[("callproof_tasks", (("state", "waiting"),))] == 0
    assert queue[("callproof_task_oldest_waiting_seconds", ())] == 0
    assert export.started_at and export.finished_at
    took = (export.finished_at - export.started_at).total_seconds()
    print(f"\nrequest answered in {answered * 1000:.0f} ms; the worker made it in {took:.1f} s ({export.size} bytes)")

    page = content(client.get("/runs/big-run/"))
    assert f'href="/runs/big-run/exports/{export.pk}.zip"' in page and 'hx-trigger="every 1s"' not in page
    download = client.get(f"/runs/big-run/exports/{export.pk}.zip")
    assert download.status_code == HTTPStatus.OK and download.streaming
    assert download["Content-Disposition"] == 'attachment; filename="big-run-evidence.zip"'
    folder = unzip(downloaded(download), tmp_path / "downloaded")
    assert verify_export(folder, run_dir) == []
    # The stable link serves the run's newest finished export.
    assert downloaded(client.get("/runs/big-run/evidence.zip")) == Path(export.path).read_bytes()


def test_who_may_ask_for_an_export_and_download_one(demo_root, exporter, django_user_model):
    importer.run_import(path=demo_root / "clean-run")
    theirs = Client()
    theirs.force_login(exporter)
    assert theirs.post("/runs/clean-run/export/").status_code == HTTPStatus.SEE_OTHER
    export = Export.objects.get()
    jobs.make_export.call(export.pk)  # the worker's part, here: the test is about the doors
    download = f"/runs/clean-run/exports/{export.pk}.zip"

    viewer = Client()
    viewer.force_login(join(django_user_model.objects.create_user("vic", password=PASSWORD), "viewer"))
    assert viewer.post("/runs/clean-run/export/").status_code == HTTPStatus.FORBIDDEN
    assert viewer.get(download).status_code == HTTPStatus.FORBIDDEN
    assert viewer.get("/runs/clean-run/exports/").status_code == HTTPStatus.FORBIDDEN
    assert viewer.get("/runs/clean-run/evidence.zip").status_code == HTTPStatus.FORBIDDEN
    page = content(viewer.get("/runs/clean-run/"))
    assert "/export/" not in page and download not in page
    assert Export.objects.count() == 1, "nothing was queued for the viewer"

    # GET never queues; a POST needs the CSRF token (a real browser's client enforces it).
    assert theirs.get("/runs/clean-run/export/").status_code == HTTPStatus.METHOD_NOT_ALLOWED
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(exporter)
    assert strict.post("/runs/clean-run/export/").status_code == HTTPStatus.FORBIDDEN
    assert Export.objects.count() == 1 and DBTaskResult.objects.count() == 1
    form = content(strict.get("/runs/clean-run/"))
    token = form.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
    assert strict.post("/runs/clean-run/export/", {"csrfmiddlewaretoken": token}).status_code == HTTPStatus.SEE_OTHER
    assert Export.objects.count() == 2

    # Another exporter may download it (the evidence is the run's, redacted); under another run's URL it is not there.
    other = Client()
    other.force_login(join(django_user_model.objects.create_user("oli", password=PASSWORD), "exporter"))
    response = other.get(download)
    assert response.status_code == HTTPStatus.OK and downloaded(response).startswith(b"PK")
    importer.run_import(path=demo_root / "send-message-killed")
    assert other.get(f"/runs/send-message-killed/exports/{export.pk}.zip").status_code == HTTPStatus.NOT_FOUND
    # A waiting export has nothing to download yet.
    waiting = Export.objects.exclude(pk=export.pk).get()
    assert other.get(f"/runs/clean-run/exports/{waiting.pk}.zip").status_code == HTTPStatus.NOT_FOUND
    # htmx asks for the panel: the POST answers with it, the export listed and polled.
    panel = content(theirs.post("/runs/clean-run/export/", headers={"HX-Request": "true"}))
    assert panel.strip().startswith('<div id="exports"') and 'hx-trigger="every 1s"' in panel and "waiting" in panel


def test_an_export_whose_worker_was_killed_is_shown_failed_and_marked_so_not_running_for_ever(
    tmp_path, export_root, exporter, client, settings
):
    settings.EVIDENCE_EXPORT_LEASE_SECONDS = 2
    run_dir = tmp_path / "runs" / "big-run"
    synthetic_run(run_dir, events=100_000, receipts=500, contract=CONTRACT)
    importer.run_import(path=run_dir)
    client.force_login(exporter)
    assert client.post("/runs/big-run/export/").status_code == HTTPStatus.SEE_OTHER
    [export] = Export.objects.all()
    worker = start_worker(this_database_url(), tmp_path / "worker.log", EVIDENCE_EXPORT_ROOT=str(export_root),
                          EVIDENCE_EXPORT_LEASE_SECONDS="2")  # fmt: skip
    try:
        # Alive, it beats the lease however long a step takes: past a lease, still running.
        until(lambda: Export.objects.get(pk=export.pk).state == Export.RUNNING, "the worker to start the export")
        first_beat = Export.objects.get(pk=export.pk).heartbeat_at
        assert first_beat is not None
        beats_after = first_beat + dt.timedelta(seconds=1)
        until(lambda: Export.objects.filter(pk=export.pk, heartbeat_at__gt=beats_after).exists(),
              "a heartbeat a second after the first")  # fmt: skip
        assert Export.objects.get(pk=export.pk).state == Export.RUNNING, "made within a second: nothing to kill"
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    finally:
        stop(worker)
    assert Export.objects.get(pk=export.pk).state == Export.RUNNING, "django-tasks leaves it running"
    time.sleep(2.5)
    page = content(client.get("/runs/big-run/"))
    assert "the worker making it stopped before it finished (killed or restarted)" in page
    assert 'hx-trigger="every 1s"' not in page, "the page stops waiting for it"
    assert jobs.remove_expired(now=protocol.utc_now()) == 0, "kept, as failed, as long as any export"
    export.refresh_from_db()
    assert export.state == Export.FAILED and export.worker_lost and export.finished_at is not None
    assert list(export_root.glob("*.zip")) == [], "no zip from a killed worker"


def test_an_export_that_fails_shows_its_error_and_leaves_no_file(tmp_path, small_disk, exporter, client):
    run_dir = tmp_path / "runs" / "mid-run"
    synthetic_run(run_dir, events=5_000, receipts=50, contract=CONTRACT)  # far more than 64 KiB of evidence
    importer.run_import(path=run_dir)
    client.force_login(exporter)
    assert client.post("/runs/mid-run/export/").status_code == HTTPStatus.SEE_OTHER
    worker = start_worker(this_database_url(), tmp_path / "worker.log", "--batch", EVIDENCE_EXPORT_ROOT=str(small_disk))
    assert worker.wait(timeout=600) == 0, (tmp_path / "worker.log").read_text()[-3000:]
    export = Export.objects.get()
    assert export.state == Export.FAILED and export.path == "" and export.finished_at is not None
    # Kept as data (a code), worded on the page in its reader's language (issue 36: it was English text).
    assert export.failure == {"code": Export.DISK_FULL, "detail": ""}
    assert DBTaskResult.objects.get(id=export.task_id).status == "FAILED"
    assert scrape(client)[("callproof_tasks", (("state", "failed"),))] == 1
    assert files_under(small_disk) == [] and list(small_disk.iterdir()) == [], "no partial file, no temp folder"
    page = content(client.get("/runs/mid-run/"))
    assert "failed</span>" in page and "the disk holding the exports is full" in page
    assert 'hx-trigger="every 1s"' not in page
    chinese = content(client.get("/runs/mid-run/exports/", HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9"))
    assert "无法写入导出：存放导出的磁盘已满" in chinese and english_on(chinese) == [], english_on(chinese)
    assert client.get(f"/runs/mid-run/exports/{export.pk}.zip").status_code == HTTPStatus.NOT_FOUND


def test_the_maintenance_tasks_do_their_work_in_a_worker(tmp_path, export_root, exporter, settings):
    from axes.models import AccessAttempt, AccessLog
    from django.contrib.sessions.backends.db import SessionStore

    now = protocol.utc_now()
    # Sessions: one past its expiry, one still valid.
    expired, valid = SessionStore(), SessionStore()
    for store, expiry in ((expired, -60), (valid, 3600)):
        store.set_expiry(expiry)
        store.create()
    # The throttle: an attempt past the cool-off and a fresh one; a login log older than the keep and a new one.
    old, fresh = now - dt.timedelta(days=1), now - dt.timedelta(minutes=1)
    for name, moment in (("old", old), ("fresh", fresh)):
        attempt = AccessAttempt.objects.create(username=name, ip_address="10.0.0.1", user_agent="t",
                                               failures_since_start=1, get_data="", post_data="")  # fmt: skip
        AccessAttempt.objects.filter(pk=attempt.pk).update(attempt_time=moment)
    for name, days in (("old", maintenance.LOGIN_LOG_KEEP_DAYS + 1), ("fresh", 1)):
        entry = AccessLog.objects.create(username=name, ip_address="10.0.0.1", user_agent="t")
        AccessLog.objects.filter(pk=entry.pk).update(attempt_time=now - dt.timedelta(days=days))
    # Exports: one finished past the keep, with its file; one finished now.
    run_dir = tmp_path / "runs" / "old-run"
    synthetic_run(run_dir, events=300, receipts=10, contract=CONTRACT)  # its last event: 2026-11-29
    importer.run_import(path=run_dir)
    run = Run.objects.get(run_id="old-run")
    kept_hours = settings.EVIDENCE_EXPORT_KEEP_HOURS
    made = []
    for finished in (now - dt.timedelta(hours=kept_hours + 1), now):
        export = Export.objects.create(run=run, requested_by=exporter, created_at=finished)
        jobs.make(export.pk)
        Export.objects.filter(pk=export.pk).update(finished_at=finished)
        made.append(Export.objects.get(pk=export.pk))
    stale, recent = made
    # Asked for past the keep and never finished: the worker that ran it was killed.
    abandoned = Export.objects.create(
        run=run, state=Export.RUNNING, created_at=now - dt.timedelta(hours=kept_hours + 1)
    )
    assert Path(stale.path).is_file() and Path(recent.path).is_file()

    call_command("enqueue_maintenance", "all", stdout=io.StringIO())
    assert DBTaskResult.objects.filter(status="READY").count() == len(maintenance.MAINTENANCE)
    archive_root = tmp_path / "archive"
    # Retention: the run is due (a day for stripping, two for archiving, since 2026-11-29).
    env = {"EVIDENCE_EXPORT_ROOT": str(export_root), "EVIDENCE_ARCHIVE_ROOT": str(archive_root),
           "EVIDENCE_STRIP_AFTER_DAYS": "1", "EVIDENCE_ARCHIVE_AFTER_DAYS": "2"}  # fmt: skip
    worker = start_worker(this_database_url(), tmp_path / "worker.log", "--batch", **env)
    assert worker.wait(timeout=600) == 0, (tmp_path / "worker.log").read_text()[-3000:]
    assert set(DBTaskResult.objects.values_list("status", flat=True)) == {"SUCCESSFUL"}

    assert expired.session_key and valid.session_key
    assert not SessionStore().exists(expired.session_key) and SessionStore().exists(valid.session_key)
    assert list(AccessAttempt.objects.values_list("username", flat=True)) == ["fresh"]
    assert list(AccessLog.objects.values_list("username", flat=True)) == ["fresh"]
    assert not Path(stale.path).exists() and not Export.objects.filter(pk=stale.pk).exists()
    assert Path(recent.path).is_file() and Export.objects.filter(pk=recent.pk).exists()
    assert not Export.objects.filter(pk=abandoned.pk).exists()
    run.refresh_from_db()
    assert run.archived and (archive_root / "old-run.tar.gz").is_file() and not run_dir.exists()


def test_enqueue_maintenance_names_what_it_knows(capsys):
    with pytest.raises(
        CommandError, match="no maintenance task 'nightly': one of retention, sessions, logins, exports"
    ):
        call_command("enqueue_maintenance", "nightly")
    out = io.StringIO()
    call_command("enqueue_maintenance", "sessions", "exports", "sessions", stdout=out)
    assert [line.split(":")[0] for line in out.getvalue().splitlines()] == ["sessions", "exports"]
    assert sorted(DBTaskResult.objects.values_list("task_path", flat=True)) == [
        "evidence.export.jobs.remove_expired_exports",
        "evidence.maintenance.clear_sessions",
    ]


def test_metrics_count_the_queue_by_state(client):
    first, second = maintenance.clear_sessions.enqueue(), jobs.remove_expired_exports.enqueue()
    DBTaskResult.objects.get(id=first.id).claim("a-worker")  # what a worker does as it takes a task
    DBTaskResult.objects.filter(id=second.id).update(enqueued_at=protocol.utc_now() - dt.timedelta(hours=1))
    values = scrape(client)
    assert [values[("callproof_tasks", (("state", state),))] for state in ("waiting", "running", "failed")] == [1, 1, 0]
    assert 3600 <= values[("callproof_task_oldest_waiting_seconds", ())] < 7200, "an hour: nobody took it"


def test_a_read_only_deployment_still_exports(demo_root, exporter, client, settings):
    """An export changes nothing of a run: EVIDENCE_READ_ONLY keeps it, as when it was a download."""
    settings.EVIDENCE_READ_ONLY = True
    importer.run_import(path=demo_root / "clean-run")
    client.force_login(exporter)
    assert "Export the redacted evidence" in content(client.get("/runs/clean-run/"))
    assert client.post("/runs/clean-run/export/").status_code == HTTPStatus.SEE_OTHER
    assert Export.objects.get().state == Export.WAITING
