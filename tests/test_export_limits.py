"""What one person may ask for of the worker (issue 36: 40 clicks in 3 s made 40 zips): one export
of a run in flight at a time, EVIDENCE_EXPORTS_PER_HOUR an hour, none while the export root is
over EVIDENCE_EXPORT_DISK_BUDGET_BYTES; each refusal said on the run page, in the reader's
language, for htmx and plain posts alike, and nothing queued."""

from __future__ import annotations

import threading
from http import HTTPStatus
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client
from django_tasks_db.models import DBTaskResult

from evidence.export import jobs
from evidence.models import Export
from tests.helpers import content, import_as_seen_later, join
from tests.i18n_check import english_on

PASSWORD = "a-long-password-1"
CHINESE = {"HTTP_ACCEPT_LANGUAGE": "zh-CN,zh;q=0.9"}
HTMX = {"HX-Request": "true"}


@pytest.fixture
def exporter(django_user_model):
    return join(django_user_model.objects.create_user("erin", password=PASSWORD), "exporter")


def refusal_on(page: str) -> tuple[str, str]:
    """The reason and words of the refusal the exports panel shows, or ('', '')."""
    marker = 'data-refused="'
    if marker not in page:
        return "", ""
    reason, said = page.split(marker, 1)[1].split("</p>", 1)[0].split('">', 1)
    return reason, said


def message_on(page: str) -> str:
    return page.split('class="message-error">', 1)[1].split("</li>", 1)[0] if 'class="message-error">' in page else ""


def test_a_second_export_while_one_is_in_flight_is_refused_and_points_at_it(demo, exporter, client):
    client.force_login(exporter)
    assert client.post("/runs/clean-run/export/").status_code == HTTPStatus.SEE_OTHER
    [first] = Export.objects.all()

    # htmx: the panel again, with the refusal and the export in flight it links to.
    panel = content(client.post("/runs/clean-run/export/", headers=HTMX))
    assert panel.strip().startswith('<div id="exports"')
    reason, said = refusal_on(panel)
    assert reason == "in_flight" and f'href="#export-{first.pk}"' in said and "still to finish" in said
    assert f'id="export-{first.pk}"' in panel
    # A plain post: back to the run page, which says it.
    response = client.post("/runs/clean-run/export/", follow=True, **CHINESE)
    assert response.redirect_chain == [("/runs/clean-run/#exports", HTTPStatus.SEE_OTHER)]
    message = message_on(content(response))
    assert f'href="#export-{first.pk}"' in message and "尚未完成" in message and english_on(message) == []
    assert Export.objects.count() == 1 and DBTaskResult.objects.count() == 1, "nothing more queued"

    # Another run, or another person, is not held back by it; once it finished, the person may ask again.
    assert client.post("/runs/send-message-killed/export/").status_code == HTTPStatus.SEE_OTHER
    jobs.make_export.call(first.pk)
    assert client.post("/runs/clean-run/export/").status_code == HTTPStatus.SEE_OTHER
    assert Export.objects.count() == 3


def test_the_per_person_rate_is_refused_saying_when_the_next_may_be_asked_for(demo, exporter, client, settings):
    settings.EVIDENCE_EXPORTS_PER_HOUR = 2
    client.force_login(exporter)
    for run_id in ("clean-run", "send-message-killed"):
        assert client.post(f"/runs/{run_id}/export/").status_code == HTTPStatus.SEE_OTHER
    oldest = Export.objects.order_by("created_at").first()
    assert oldest is not None

    response = client.post("/runs/write-file-killed/export/", follow=True)
    message = message_on(content(response))
    assert "you asked for 2 exports in the last hour" in message
    # When: an hour after the older of the two, as every time on the site is shown.
    assert f'datetime="{oldest.created_at + jobs.RATE_WINDOW:%Y-%m-%dT%H:%M:%S.%fZ}"' in message, message
    panel = content(client.post("/runs/write-file-killed/export/", headers=HTMX, **CHINESE))
    reason, said = refusal_on(panel)
    assert reason == "rate" and "2" in said and english_on(said) == [], said
    assert Export.objects.count() == 2

    # Someone else still may.
    other = Client()
    other.force_login(join(type(exporter).objects.create_user("oli", password=PASSWORD), "exporter"))
    assert other.post("/runs/write-file-killed/export/").status_code == HTTPStatus.SEE_OTHER
    assert Export.objects.count() == 3


def test_over_the_disk_budget_new_exports_are_refused(demo, exporter, client, settings, export_root):
    client.force_login(exporter)
    assert client.post("/runs/clean-run/export/").status_code == HTTPStatus.SEE_OTHER
    made = jobs.make_export.call(Export.objects.get().pk)
    zip_file = Path(Export.objects.get().path)
    settings.EVIDENCE_EXPORT_DISK_BUDGET_BYTES = zip_file.stat().st_size  # the root holds exactly its budget
    assert made["size"] == zip_file.stat().st_size

    panel = content(client.post("/runs/clean-run/export/", headers=HTMX))
    reason, said = refusal_on(panel)
    assert reason == "disk" and "the exports kept on the server fill the space they are given" in said
    message = message_on(content(client.post("/runs/clean-run/export/", follow=True, **CHINESE)))
    assert message and english_on(message) == [], message
    assert Export.objects.count() == 1

    # Once the zip is gone (the maintenance task, or an operator), exports are asked for again.
    zip_file.unlink()
    assert client.post("/runs/clean-run/export/").status_code == HTTPStatus.SEE_OTHER
    assert Export.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_requests_at_the_same_moment_queue_one_export(demo_root, django_user_model):
    """Real concurrent requests, each on its own connection: the person's row lock lets one pass."""
    import_as_seen_later(demo_root)
    exporter = join(django_user_model.objects.create_user("erin", password=PASSWORD), "exporter")
    clients = []
    for _ in range(6):
        each = Client()
        each.force_login(exporter)
        clients.append(each)
    start = threading.Barrier(len(clients))
    answers: list[int] = []

    def ask(each: Client) -> None:
        try:
            start.wait()
            answers.append(each.post("/runs/clean-run/export/", headers=HTMX).status_code)
        finally:
            connection.close()  # this thread's own connection

    threads = [threading.Thread(target=ask, args=(each,)) for each in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [HTTPStatus.OK] * len(clients)
    assert Export.objects.count() == 1 and DBTaskResult.objects.count() == 1


def test_a_failed_exports_error_is_kept_as_a_code_and_worded_in_the_readers_language(
    demo, exporter, client, settings, tmp_path
):
    """Issue 36: the error was stored as English text and shown so on Chinese pages."""
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the export root should be")
    settings.EVIDENCE_EXPORT_ROOT = blocked
    client.force_login(exporter)
    assert client.post("/runs/clean-run/export/").status_code == HTTPStatus.SEE_OTHER
    export = Export.objects.get()
    with pytest.raises(FileExistsError):
        jobs.make_export.call(export.pk)
    export.refresh_from_db()
    assert export.state == Export.FAILED and export.failure == {"code": Export.NOT_WRITTEN, "detail": "File exists"}
    english = content(client.get("/runs/clean-run/exports/"))
    assert 'the export could not be written: <span translate="no">File exists</span>' in english
    chinese = content(client.get("/runs/clean-run/exports/", **CHINESE))
    assert '无法写入导出：<span translate="no">File exists</span>' in chinese and english_on(chinese) == []
    # One kept as text before errors were codes is shown as it was written, as a value.
    Export.objects.filter(pk=export.pk).update(error="the export could not be written: Permission denied")
    assert '<span translate="no">the export could not be written: Permission denied</span>' in content(
        client.get("/runs/clean-run/exports/", **CHINESE)
    )
