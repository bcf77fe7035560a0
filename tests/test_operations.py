"""Operations: /metrics for Prometheus, and one JSON object a log line."""

from __future__ import annotations

import json
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from evidence.ingest import importer
from evidence.models import Run
from evidence.review import inbox
from receipts import protocol
from tests.helpers import export_through_the_page, first_call_of, join


def scrape(client, **headers) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def test_metrics_say_what_needs_a_person_from_the_rows(demo, client):
    values = scrape(client)
    # The same calls the inbox asks a person about, the altered receipt among them.
    calls = [item for item in inbox.inbox_items() if item.kind in (inbox.IN_DOUBT, inbox.TAMPERED)]
    assert {"tampered-receipt", "send-message-killed"} <= {item.run_id for item in calls}
    assert values[("callproof_calls_in_doubt", ())] == len(calls)
    assert values[("callproof_stale_reservations", ())] == 1
    assert values[("callproof_open_findings", (("code", "stale_reservation"), ("digest", "false")))] == 1
    live = Run.objects.exclude(state__in=protocol.FINISHED_STATES).values_list("run_id", flat=True)
    assert {labels[0][1] for name, labels in values if name == "callproof_run_import_lag_seconds"} == set(live)
    assert values[("callproof_evidence_exports_total", ())] == 0
    assert values[("callproof_last_import_timestamp_seconds", ())] > 0


def test_a_settlement_and_an_export_are_counted(demo, client, django_user_model):
    person = join(django_user_model.objects.create_user("carol"), "confirmer", "exporter")
    client.force_login(person)
    call = first_call_of("send-message-killed")
    form = {"resolution": "committed", "reason": "the mail log shows it", "confirm_call_id": call.call_id[:12],
            "receipt_sha256": call.file_sha256}  # fmt: skip
    assert client.post(f"/runs/send-message-killed/calls/{call.call_id}/confirm/", form).status_code == 303
    download = export_through_the_page(client, "clean-run")
    assert download.status_code == 200 and b"".join(download.streaming_content).startswith(b"PK")
    values = scrape(client)
    assert values[("callproof_confirmations_total", (("via", "dashboard"),))] == 1
    assert values[("callproof_evidence_exports_total", ())] == 1


@pytest.mark.parametrize(
    ("token", "headers", "allowed"),
    [
        ("", {}, True),  # on this machine, straight to the server
        ("", {"HTTP_X_FORWARDED_FOR": "203.0.113.5"}, False),  # passed on by a proxy
        ("", {"REMOTE_ADDR": "203.0.113.5"}, False),
        ("s3cret-token", {}, False),  # with a token set, loopback is not enough
        ("s3cret-token", {"HTTP_AUTHORIZATION": "Bearer wrong"}, False),
        ("s3cret-token", {"HTTP_AUTHORIZATION": "Bearer s3cret-token", "REMOTE_ADDR": "203.0.113.5"}, True),
    ],
)
def test_metrics_need_this_machine_or_the_token(token, headers, allowed, db, client, settings):
    settings.EVIDENCE_METRICS_TOKEN = token
    response = client.get("/metrics", **headers)
    assert response.status_code == (200 if allowed else 403)
    assert (b"callproof_calls_in_doubt" in response.content) == allowed


def test_imports_settlements_and_retention_log_one_json_object_a_line(demo_root, db, caplog):
    from evidence.lib.logs import JsonFormatter

    with caplog.at_level(logging.INFO, logger="callproof"):
        importer.root_import(root=demo_root)
    lines = [json.loads(JsonFormatter().format(record)) for record in caplog.records]
    imported = [line for line in lines if line["event"] == "run_imported"]
    assert {line["run_id"] for line in imported} == set(Run.objects.values_list("run_id", flat=True))
    assert all({"time", "level", "logger", "message", "run_id", "call_id"} <= set(line) for line in lines)
    assert all(line["call_id"] is None and line["events"] >= 0 for line in imported)


def test_a_settlement_and_a_legal_hold_log_their_run_and_call(demo, client, django_user_model, caplog):
    from evidence.lib.logs import JsonFormatter

    person = join(django_user_model.objects.create_user("carol"), "confirmer", "admin")
    client.force_login(person)
    call = first_call_of("send-message-killed")
    form = {"resolution": "rejected", "reason": "no line carries it", "confirm_call_id": call.call_id[:12],
            "receipt_sha256": call.file_sha256, "confirm_against_evidence": "on"}  # fmt: skip
    with caplog.at_level(logging.INFO, logger="callproof"):
        client.post(f"/runs/send-message-killed/calls/{call.call_id}/confirm/", form)
        client.post("/runs/clean-run/hold/", {"hold": "set", "reason": "a court asked"})
    lines = [json.loads(JsonFormatter().format(record)) for record in caplog.records]
    settled = next(line for line in lines if line["event"] == "call_settled")
    assert (settled["run_id"], settled["call_id"], settled["resolution"], settled["actor"]) == (
        "send-message-killed", call.call_id, "rejected", "carol")  # fmt: skip
    held = next(line for line in lines if line["event"] == "legal_hold_set")
    assert (held["run_id"], held["call_id"]) == ("clean-run", None)
