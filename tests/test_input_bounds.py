"""Every text a person types and every time a client gives is bounded, and a value out of bounds
is a clear refusal (a form error, a 400 or a 422), never a 500 and never a value stored that a
page cannot read back: on both databases."""

from __future__ import annotations

import pytest
from django.test import Client

from evidence.models import AuditEntry, Finding, Run
from tests.helpers import join

pytestmark = pytest.mark.django_db

CHINESE = {"HTTP_ACCEPT_LANGUAGE": "zh-CN,zh;q=0.9"}


@pytest.fixture
def holder(client, django_user_model):
    client.force_login(join(django_user_model.objects.create_user("holder"), "viewer", "confirmer", "admin"))
    return client


def test_a_nul_in_a_legal_hold_reason_is_refused_not_a_500(holder, demo):
    response = holder.post("/runs/clean-run/hold/", {"hold": "set", "reason": "court\x00order"}, follow=True)
    assert response.status_code == 200
    assert not Run.objects.get(run_id="clean-run").legal_hold
    assert "Null characters are not allowed" in response.content.decode()


def test_a_legal_hold_reason_has_a_limit_said_beside_the_field(holder, demo):
    page = holder.get("/runs/clean-run/").content.decode()
    assert 'maxlength="2000"' in page and "At most 2000 characters" in page
    response = holder.post("/runs/clean-run/hold/", {"hold": "set", "reason": "x" * 900_000}, follow=True)
    assert response.status_code == 200
    assert not Run.objects.get(run_id="clean-run").legal_hold
    assert not AuditEntry.objects.filter(action=AuditEntry.LEGAL_HOLD_SET).exists()
    assert "at most 2000 characters" in response.content.decode()
    holder.post("/runs/clean-run/hold/", {"hold": "set", "reason": "x" * 2000})
    assert Run.objects.get(run_id="clean-run").legal_hold


def test_an_empty_legal_hold_reason_is_said_in_the_readers_language(holder, demo):
    response = holder.post("/runs/clean-run/hold/", {"hold": "set", "reason": "  "}, follow=True, **CHINESE)
    page = response.content.decode()
    assert "a legal hold is set or lifted with a reason" not in page
    assert "设置或解除法律保全须说明理由" in page
    assert not Run.objects.get(run_id="clean-run").legal_hold


def _a_finding() -> Finding:
    return Finding.objects.filter(run__isnull=False, closed_at__isnull=True).order_by("pk")[0]


def test_a_nul_in_the_apis_triage_reason_is_a_422_not_a_500(holder, demo):
    finding = _a_finding()
    response = holder.post(
        f"/api/findings/{finding.pk}/triage",
        {"action": "acknowledge", "reason": "seen\x00"},
        content_type="application/json",
    )
    assert response.status_code == 422, response.content
    assert Finding.objects.get(pk=finding.pk).triage == ""


def test_the_apis_triage_reason_has_the_forms_limit(holder, demo):
    from evidence.review import triage

    finding = _a_finding()
    response = holder.post(f"/api/findings/{finding.pk}/triage",
                           {"action": "acknowledge", "reason": "x" * (triage.REASON_LIMIT + 1)},
                           content_type="application/json")  # fmt: skip
    assert response.status_code == 422, response.content
    schema = holder.get("/api/openapi.json").json()["components"]["schemas"]["TriageIn"]["properties"]["reason"]
    assert schema["maxLength"] == triage.REASON_LIMIT


def test_a_login_with_a_user_name_over_255_characters_is_a_form_error(db):
    """Through the real login view with django-axes counting the failure (its column holds 255)."""
    client = Client(raise_request_exception=False)
    response = client.post("/accounts/login/", {"username": "n" * 300, "password": "whatever"})
    assert response.status_code == 200, response.status_code
    assert 'maxlength="150"' in response.content.decode()


def test_a_nul_in_what_a_shipper_sends_is_a_400_not_a_500(client, demo, django_user_model, settings):
    """The middleware reads the address only: a header's or a JSON body's NUL reached PostgreSQL."""
    import json

    from evidence.ingest import shipping
    from evidence.models import Host, HumanDecision
    from evidence.review import settle
    from tests.helpers import first_call_of

    key = shipping.new_key("agent-a")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}", "HTTP_X_CALLPROOF_SHIPPER": "one"}
    root = client.get("/ship/v1/instructions", HTTP_X_CALLPROOF_ROOT="/srv/\x00runs", **headers)
    assert root.status_code == 400 and "NUL" in root.json()["error"]
    call = first_call_of("send-message-killed")
    Run.objects.filter(pk=call.run.pk).update(host=Host.objects.get(name="agent-a"))
    confirmer = join(django_user_model.objects.create_user("dana"), "confirmer")
    settings.EVIDENCE_HOST_NAME = "web-host"  # the run is the agent host's: its shipper delivers the decision
    settle.settle_call(run=call.run, call=call, user=confirmer, resolution="committed", reason="seen",
                       typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256)  # fmt: skip
    decision = HumanDecision.objects.get(run=call.run, call_id=call.call_id)
    ack = [{"id": f"decision-{decision.pk}", "outcome": "failed", "detail": "disk\x00full"}]
    acked = client.post("/ship/v1/acks", json.dumps(ack), content_type="application/json", **headers)
    assert acked.status_code == 400 and "NUL" in acked.json()["error"]
    decision.refresh_from_db()
    assert decision.delivery_error == ""


@pytest.mark.parametrize(
    ("url", "box"),
    [("/search/?q=", "site-search"), ("/findings/?run=", "run-filter"), ("/inbox/?run=", "inbox-run"),
     ("/audit/?run=", "audit-run"), ("/audit/?actor=", "audit-actor"), ("/api/findings?run_id=", None),
     ("/api/inbox?run_id=", None), ("/api/audit?actor=", None), ("/api/audit/actions?run_id=", None)],
)  # fmt: skip
def test_a_search_box_or_filter_takes_at_most_its_limit(holder, demo, url, box):
    from evidence.web.views.common import TYPED_LIMIT

    assert holder.get(url + "a" * TYPED_LIMIT).status_code == 200
    response = holder.get(url + "a" * (TYPED_LIMIT + 1))
    assert response.status_code == 400
    if box is None:
        assert f"at most {TYPED_LIMIT} characters" in response.json()["detail"]
    else:
        assert f"at most <code>{TYPED_LIMIT}</code> characters" in response.content.decode()
    if box is not None:
        assert f'id="{box}" name="' in holder.get(url).content.decode()
        assert f'maxlength="{TYPED_LIMIT}"' in holder.get(url).content.decode().split(f'id="{box}"')[1].split(">")[0]
