"""An evidence export is written in the language of the person who asked for it (docs/operators.md,
"Languages"): its page in their language, its evidence.json and manifest the same in both, and
both verify."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest
from django.utils import translation

from evidence.models import Export
from receipts.reader.verify import verify_export
from tests.helpers import downloaded, export_through_the_page, join
from tests.i18n_check import english_on


@pytest.fixture(autouse=True)
def language_left_as_found():
    """The test client's requests activate their language in this thread: leave none behind."""
    yield
    translation.deactivate()


LANGUAGES = {"en": "en-GB,en;q=0.9", "zh-hans": "zh-CN,zh;q=0.9,en;q=0.5"}


def export_in(client, run_id: str, accept_language: str, folder: Path) -> Path:
    """The run's evidence asked for by someone whose browser reads ``accept_language``, unzipped."""
    client.defaults["HTTP_ACCEPT_LANGUAGE"] = accept_language
    response = export_through_the_page(client, run_id)
    assert response.status_code == 200
    with zipfile.ZipFile(io.BytesIO(downloaded(response))) as bundle:
        bundle.extractall(folder)
    return folder / f"{run_id}-evidence"


@pytest.mark.parametrize("run_id", ["tampered-receipt", "conflict-same-id", "write-file-killed"])
def test_an_export_is_written_in_the_language_of_who_asked_and_verifies_in_both(
    client, demo, django_user_model, export_root, tmp_path, run_id
):
    client.force_login(join(django_user_model.objects.create_user("wei", password="a-long-password-1"), "exporter"))
    out = {language: export_in(client, run_id, accept, tmp_path / language) for language, accept in LANGUAGES.items()}
    assert list(Export.objects.order_by("pk").values_list("language", flat=True)) == ["en", "zh-hans"]
    for folder in out.values():
        assert verify_export(folder) == []
    # Against the run directory, what the reader finds (tampered-receipt's altered receipt) is the same.
    assert verify_export(out["en"], demo / run_id) == verify_export(out["zh-hans"], demo / run_id)
    english, chinese = ((out[language] / "index.html").read_text(encoding="utf-8") for language in LANGUAGES)
    assert '<html lang="en">' in english and f'Evidence of run <span translate="no">{run_id}</span>' in english
    assert '<html lang="zh-Hans">' in chinese and "如何校验此证据" in chinese
    assert english_on(chinese) == []
    # evidence.json is the same but for the manifest's page: its language and digest.
    documents = {language: json.loads((folder / "evidence.json").read_bytes()) for language, folder in out.items()}
    pages = {language: document["manifest"].pop("page_sha256") for language, document in documents.items()}
    shown_in = {language: document["manifest"].pop("page")["language"] for language, document in documents.items()}
    assert documents["en"] == documents["zh-hans"]
    assert pages["en"] != pages["zh-hans"] and shown_in == {"en": "en", "zh-hans": "zh-Hans"}


def test_an_export_asked_for_before_languages_were_kept_is_written_in_the_default(demo, django_user_model, export_root):
    from evidence.export import jobs
    from evidence.models import Run

    wei = join(django_user_model.objects.create_user("wei", password="a-long-password-1"), "exporter")
    export = jobs.request_export(run=Run.objects.get(run_id="clean-run"), user=wei, language="zh-hans")
    Export.objects.filter(pk=export.pk).update(language="")
    jobs.make_export.call(export.pk)
    export.refresh_from_db()
    with zipfile.ZipFile(export.path) as bundle:
        page = bundle.read("clean-run-evidence/index.html").decode()
    assert '<html lang="en">' in page


def test_the_command_line_writes_english_whatever_language_is_active(demo, tmp_path):
    from django.core.management import call_command

    with translation.override("zh-hans"):
        call_command("export_evidence", "clean-run", "--out", str(tmp_path / "out"))
    (page,) = (tmp_path / "out").rglob("index.html")
    assert '<html lang="en">' in page.read_text(encoding="utf-8")
