"""The doubt panel learns from the SQL and HTTP adapters the dashboard is configured with (EVIDENCE_ADAPTERS)."""

from __future__ import annotations

import html
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.urls import reverse
from django.utils.html import strip_tags

from evidence.apps import register_evidence_adapters
from evidence.ingest import importer
from receipts import doubt, runtime
from receipts.adapters.http import HttpRequest
from receipts.demo import writer_env
from tests.helpers import PROJECT, content
from tests.idempotent_service import Service
from tests.test_site import settings_env

NOTE = {"title": "deploy", "body": "<script>alert(1)</script>"}
CHARGE = {"amount": 1200}


@pytest.fixture(autouse=True)
def own_registry(monkeypatch):
    """What start-up registers, for this test only: the registry is the process's."""
    monkeypatch.setattr(doubt, "_REGISTRY", dict(doubt._REGISTRY))
    monkeypatch.setattr(doubt, "_DESCRIPTIONS", dict(doubt._DESCRIPTIONS))


def sql_call_in_doubt(run_dir, monkeypatch, tmp_path) -> str:
    """A writer killed after inserting the row: the receipt still says prepared."""
    monkeypatch.setenv("CALLPROOF_SQL_SQLITE", str(tmp_path / "rows.sqlite3"))
    script = (
        "import sys; from receipts import runtime; from receipts.adapters.sql import sqlite_factory\n"
        f"a = sqlite_factory(); runtime.Executor(sys.argv[1], {{a.name: a}}).call(a.name, {NOTE!r})"
    )
    env = writer_env(RECEIPTS_FAILPOINT="after_effect")
    killed = subprocess.run([sys.executable, "-c", script, str(run_dir)], env=env, cwd=PROJECT, check=False)
    assert killed.returncode == 137
    [receipt] = (run_dir / "receipts").glob("*.json")
    return receipt.stem


@pytest.mark.django_db
def test_the_panel_shows_the_row_of_a_configured_sql_adapter(run_dir, logged_in, monkeypatch, tmp_path):
    call_id = sql_call_in_doubt(run_dir, monkeypatch, tmp_path)
    importer.run_import(path=run_dir)
    url = reverse("call", args=[run_dir.name, call_id])
    before = content(logged_in.get(url))
    assert "Run the tool sql_row with" in before and "Nothing can look at this tool" in before
    register_evidence_adapters(["receipts.adapters.sql:sqlite_factory"])
    page = content(logged_in.get(url))
    assert "This call is in doubt" in page and 'badge-info">present' in page
    # The fact in the reader's language, each value in it marked as data (and escaped).
    shown = html.unescape(strip_tags(page))
    assert f"table notes holds the row whose call_id is {call_id}: title=deploy, body=<script>" in shown
    assert '<span translate="no">title=deploy, body=&lt;script&gt;' in page
    assert "Insert a row into table notes, keyed by the call_id in call_id" in page
    assert "<script>alert(1)</script>" not in logged_in.get(url).content.decode(), "escaped"


@pytest.mark.django_db
@pytest.mark.parametrize("lookup", [True, False])
def test_the_panel_asks_a_configured_http_service_or_says_what_to_look_for(run_dir, logged_in, monkeypatch, lookup):
    with Service() as service:
        service.script = ["drop"]
        adapter = HttpRequest(name="http_request", url=f"{service.url}/v1/charges", retries=0)
        outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
        assert outcome.status == "unknown"
        importer.run_import(path=run_dir)
        monkeypatch.setenv("CALLPROOF_HTTP_URL", f"{service.url}/v1/charges")
        if lookup:
            monkeypatch.setenv("CALLPROOF_HTTP_LOOKUP_URL", f"{service.url}/v1/charges?idempotency_key={{call_id}}")
        else:
            monkeypatch.delenv("CALLPROOF_HTTP_LOOKUP_URL", raising=False)
        register_evidence_adapters(["receipts.adapters.http:http_factory"])
        page = content(logged_in.get(reverse("call", args=[run_dir.name, outcome.call_id])))
        [charge] = service.charges
        lookups = [path for path, _ in service.requests if path.startswith("GET")]
    assert f"POST {service.url}/v1/charges with Idempotency-Key = the call_id" in page
    if lookup:
        assert 'badge-info">present' in page and f"resource {charge['id']}" in page
        assert lookups == ["GET /v1/charges"]
    else:
        wanted = f"look in the service at POST {service.url}/v1/charges for the request with Idempotency-Key: "
        assert wanted + outcome.call_id in page
        assert lookups == [], "no lookup configured: the dashboard sends nothing"


def test_a_factory_that_fails_stops_start_up_with_what_went_wrong(monkeypatch):
    monkeypatch.delenv("CALLPROOF_HTTP_URL", raising=False)
    with pytest.raises(ImproperlyConfigured, match="http_factory built no adapter: ValueError: CALLPROOF_HTTP_URL"):
        register_evidence_adapters(["receipts.adapters.http:http_factory"])
    with pytest.raises(ImproperlyConfigured, match="no name and evidence"):
        register_evidence_adapters(["tests.helpers:Path"])  # a callable that builds something else


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("receipts.adapters.sql", "EVIDENCE_ADAPTERS names module:factory callables, not receipts.adapters.sql"),
        ("receipts.adapters.http:http_factory", "http_factory built no adapter: ValueError: CALLPROOF_HTTP_URL must"),
    ],
)
def test_manage_py_refuses_a_bad_evidence_adapters_setting(value, message):
    completed = subprocess.run([sys.executable, "manage.py", "check"], cwd=PROJECT, capture_output=True, text=True,
                               env=settings_env(DJANGO_DEBUG="1", EVIDENCE_ADAPTERS=value), check=False)  # fmt: skip
    assert completed.returncode != 0 and message in completed.stderr
