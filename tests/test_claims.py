""" "I'm on it" (evidence/review/claims.py): who may claim, what the others see, how a claim ends, the
audit of each step, and two people claiming at once."""

from __future__ import annotations

import datetime as dt
import re
import threading
from http import HTTPStatus

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from evidence.maintenance import MAINTENANCE
from evidence.models import AuditEntry, Claim, Finding
from evidence.review import claims, inbox, settle, triage
from receipts import protocol
from tests.helpers import content, first_call_of, join

pytestmark = pytest.mark.django_db

RUN, CONFLICT_RUN = "send-message-killed", "conflict-same-id"
URL = "/inbox/claim/"


def call_item() -> claims.Item:
    call = first_call_of(RUN)
    item = claims.item_of_call(call)
    assert item is not None, "the demo's call is in doubt"
    return item


def finding_item() -> claims.Item:
    item = claims.item_of_finding(conflict())
    assert item is not None, "the demo's conflict is open"
    return item


def conflict() -> Finding:
    return Finding.objects.get(code="submission_conflict", run__run_id=CONFLICT_RUN, closed_at__isnull=True)


def form(item: claims.Item, action: str = claims.CLAIM, **more: str) -> dict[str, str]:
    return {"kind": item.kind, "run": item.run_id, "subject": item.subject, "action": action, **more}


@pytest.fixture
def people(django_user_model):
    carol = join(django_user_model.objects.create_user("carol"), "confirmer")
    dave = join(django_user_model.objects.create_user("dave"), "confirmer")
    return carol, dave


def as_person(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def audit(action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=action).order_by("id"))


def test_a_claim_shows_on_the_inbox_row_and_on_the_call_page_with_the_persons_id(demo, people):
    carol, dave = people
    item = call_item()
    response = as_person(carol).post(URL, form(item, next="/inbox/"))
    assert response.status_code == HTTPStatus.SEE_OTHER and response["Location"] == "/inbox/"
    [entry] = audit(AuditEntry.CLAIMED)
    assert (entry.user_id, entry.actor, entry.run_id) == (carol.pk, "carol", first_call_of(RUN).run_id)
    assert entry.subject == f"{item.kind}: {item.subject}"
    for page in (reverse("inbox"), reverse("call", args=[RUN, item.subject])):
        seen = content(as_person(dave).get(page))
        assert re.search(rf'carol</span> <span class="muted person-id">#{carol.pk}</span> is on it since <time', seen)
        assert 'value="claim">Take over</button>' in seen  # dave may take it over, after a question
        mine = content(as_person(carol).get(page))
        assert 'value="release">Let it go</button>' in mine


def test_a_findings_claim_shows_on_its_triage_page(demo, people):
    carol, dave = people
    finding = conflict()
    item = finding_item()
    assert item == claims.Item(inbox.CONFLICT, CONFLICT_RUN, finding.subject)
    assert as_person(carol).post(URL, form(item)).status_code == HTTPStatus.SEE_OTHER
    seen = content(as_person(dave).get(reverse("triage", args=[finding.pk])))
    assert f"#{carol.pk}</span> is on it since" in seen


def test_a_viewer_sees_the_claim_and_no_button_and_may_not_claim(demo, people, django_user_model):
    carol, _ = people
    viewer = join(django_user_model.objects.create_user("vera"), "viewer")
    item = call_item()
    assert as_person(viewer).post(URL, form(item)).status_code == HTTPStatus.FORBIDDEN
    assert not Claim.objects.exists() and not audit(AuditEntry.CLAIMED)
    claims.claim(item=item, user=carol)
    seen = content(as_person(viewer).get(reverse("inbox")))
    assert "is on it since" in seen and 'action="/inbox/claim/"' not in seen


def test_an_exporter_may_not_claim_a_finding(demo, django_user_model):
    exporter = join(django_user_model.objects.create_user("eve"), "exporter")
    item = finding_item()
    assert as_person(exporter).post(URL, form(item)).status_code == HTTPStatus.FORBIDDEN


def test_taking_over_a_live_claim_asks_first_then_is_audited(demo, people):
    carol, dave = people
    item = call_item()
    claims.claim(item=item, user=carol)
    asked = as_person(dave).post(URL, form(item))
    assert asked.status_code == HTTPStatus.CONFLICT
    page = content(asked)
    assert "Someone else is on it" in page and 'name="take_over" value="1"' in page
    assert Claim.objects.get().user_id == carol.pk
    taken = as_person(dave).post(URL, form(item, take_over="1"))
    assert taken.status_code == HTTPStatus.SEE_OTHER
    assert Claim.objects.get().user_id == dave.pk
    last = audit(AuditEntry.CLAIMED)[-1]
    assert last.user_id == dave.pk and last.reason == f"taken over from #{carol.pk} carol, whose claim was live"
    audit_page = content(as_person(dave).get(reverse("audit") + "?list=actions"))
    assert "a person said they are on an inbox item" in audit_page and AuditEntry.CLAIMED in audit_page
    assert f"taken over from #{carol.pk} carol, whose claim was live" in audit_page


def test_an_expired_claim_is_taken_without_a_question_and_its_expiry_audited(demo, people, settings):
    carol, dave = people
    settings.EVIDENCE_CLAIM_MINUTES = 30
    item = call_item()
    then = protocol.utc_now() - dt.timedelta(minutes=31)
    claims.claim(item=item, user=carol, now=then)
    seen = content(as_person(dave).get(reverse("inbox")))
    assert "is on it since" not in seen  # over, though nothing has removed it yet
    assert as_person(dave).post(URL, form(item)).status_code == HTTPStatus.SEE_OTHER
    [expired] = audit(AuditEntry.CLAIM_EXPIRED)
    assert expired.user_id == carol.pk and expired.reason == "no act within 30 min"
    assert expired.at == then + dt.timedelta(minutes=30)
    assert Claim.objects.get().user_id == dave.pk


def test_the_maintenance_task_expires_claims_and_audits_each(demo, people):
    carol, _ = people
    claims.claim(item=finding_item(), user=carol)  # live: stays
    claims.claim(item=call_item(), user=carol, now=protocol.utc_now() - dt.timedelta(hours=2))
    assert MAINTENANCE["claims"].call() == {"claims": 1}
    assert len(audit(AuditEntry.CLAIM_EXPIRED)) == 1 and Claim.objects.count() == 1


def test_letting_go_is_audited_and_only_ones_own(demo, people):
    carol, dave = people
    item = call_item()
    claims.claim(item=item, user=carol)
    refused = as_person(dave).post(URL, form(item, claims.RELEASE))
    assert refused.status_code == HTTPStatus.CONFLICT and Claim.objects.exists()
    assert as_person(carol).post(URL, form(item, claims.RELEASE)).status_code == HTTPStatus.SEE_OTHER
    assert not Claim.objects.exists()
    [released] = audit(AuditEntry.CLAIM_RELEASED)
    assert (released.user_id, released.reason) == (carol.pk, "let go")


def test_settling_the_call_releases_the_claim(demo, people):
    carol, _ = people
    item = call_item()
    claims.claim(item=item, user=carol)
    call = first_call_of(RUN)
    settle.settle_call(run=call.run, call=call, user=carol, resolution="committed", reason="the mail log shows it",
                       typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256)  # fmt: skip
    assert not Claim.objects.exists()
    [released] = audit(AuditEntry.CLAIM_RELEASED)
    assert (released.user_id, released.reason) == (carol.pk, "settled")


def test_someone_elses_triage_releases_the_claim_and_says_who(demo, people):
    carol, dave = people
    finding = conflict()
    claims.claim(item=finding_item(), user=carol)
    triage.act(finding=finding, user=dave, action=triage.ACKNOWLEDGE, reason="known", now=protocol.utc_now())
    assert not Claim.objects.exists()
    [released] = audit(AuditEntry.CLAIM_RELEASED)
    assert (released.user_id, released.reason) == (carol.pk, f"acknowledged by #{dave.pk} dave")


def test_claiming_again_renews_ones_own_claim(demo, people, settings):
    carol, _ = people
    item = call_item()
    first = claims.claim(item=item, user=carol, now=protocol.utc_now() - dt.timedelta(minutes=10))
    again = claims.claim(item=item, user=carol)
    assert again.pk == first.pk and again.expires_at > first.expires_at
    assert [e.reason for e in audit(AuditEntry.CLAIMED)] == ["", "renewed"]


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ({"kind": "silent host"}, HTTPStatus.FORBIDDEN),  # no one acts on a host from here
        ({"kind": "nonsense"}, HTTPStatus.BAD_REQUEST),
        ({"action": "steal"}, HTTPStatus.BAD_REQUEST),
        ({"subject": "x" * 451}, HTTPStatus.BAD_REQUEST),
        ({"run": ""}, HTTPStatus.BAD_REQUEST),
        ({"subject": "no-such-call"}, HTTPStatus.NOT_FOUND),
        ({"kind": inbox.TAMPERED}, HTTPStatus.NOT_FOUND),  # the call is in doubt, not tampered
    ],
)
def test_a_bad_claim_is_a_clear_4xx_and_changes_nothing(demo, people, change, status):
    carol, _ = people
    response = as_person(carol).post(URL, {**form(call_item()), **change})
    assert response.status_code == status
    assert not Claim.objects.exists() and not audit(AuditEntry.CLAIMED)


def test_get_is_405_and_csrf_is_enforced(demo, people):
    carol, _ = people
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(carol)
    item = call_item()
    assert strict.get(URL).status_code == HTTPStatus.METHOD_NOT_ALLOWED
    assert strict.post(URL, form(item)).status_code == HTTPStatus.FORBIDDEN
    assert not Claim.objects.exists()
    page = content(strict.get(reverse("inbox")))
    token = re.search(r'class="claim-form">\s*<input type="hidden" name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token, page
    assert strict.post(URL, form(item, csrfmiddlewaretoken=token.group(1))).status_code == HTTPStatus.SEE_OTHER


def test_htmx_gets_the_box_in_place(demo, people):
    carol, dave = people
    item = call_item()
    box = as_person(carol).post(URL, form(item), HTTP_HX_REQUEST="true")
    assert box.status_code == HTTPStatus.OK
    text = content(box)
    assert text.lstrip().startswith('<div class="claim"') and "is on it since" in text and "Let it go" in text
    asked = content(as_person(dave).post(URL, form(item), HTTP_HX_REQUEST="true"))
    assert 'role="alert"' in asked and 'name="take_over" value="1"' in asked


@pytest.mark.django_db(transaction=True)
def test_two_people_claiming_at_once_one_wins(demo, django_user_model):
    carol = join(django_user_model.objects.create_user("carol"), "confirmer")
    dave = join(django_user_model.objects.create_user("dave"), "confirmer")
    item = call_item()
    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def claim(user) -> None:
        try:
            barrier.wait()
            outcomes[user.username] = claims.claim(item=item, user=user)
        except claims.ClaimError as refused:
            outcomes[user.username] = refused
        finally:
            connection.close()

    threads = [threading.Thread(target=claim, args=(user,)) for user in (carol, dave)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    wins = [o for o in outcomes.values() if isinstance(o, Claim)]
    losses = [o for o in outcomes.values() if isinstance(o, claims.ClaimError)]
    assert len(wins) == 1 and len(losses) == 1, outcomes
    assert losses[0].status == HTTPStatus.CONFLICT
    [held] = Claim.objects.all()
    assert held.user_id == wins[0].user_id
    [entry] = audit(AuditEntry.CLAIMED)
    assert entry.user_id == held.user_id


def test_a_read_only_deployment_shows_claims_and_takes_none(demo, people, settings):
    carol, dave = people
    item = call_item()
    claims.claim(item=item, user=carol)
    settings.EVIDENCE_READ_ONLY = True
    assert as_person(dave).post(URL, form(item, take_over="1")).status_code == HTTPStatus.FORBIDDEN
    page = content(as_person(dave).get(reverse("inbox")))
    assert "is on it since" in page and 'action="/inbox/claim/"' not in page
    assert Claim.objects.get().user_id == carol.pk
