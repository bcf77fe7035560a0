"""Triage: a finding acknowledged or snoozed with a reason leaves the inbox's open view, is listed
under its own, comes back when undone, when its snooze's time comes or when the import sees it
change; every act is audited, guarded (permission, CSRF, POST) and refused with a clear error."""

from __future__ import annotations

import datetime as dt
import json
from http import HTTPStatus

import pytest
from django.test import Client
from django.urls import reverse

from evidence.ingest import importer, storing
from evidence.models import AuditEntry, Finding, Run, Submission
from evidence.review import inbox, listings, triage
from evidence.web.api import new_token
from receipts import protocol, runtime
from receipts.demo import login_request
from receipts.findings import FindingRecord
from tests.helpers import content, join

pytestmark = pytest.mark.django_db

CONFLICT_RUN, STALE_RUN = "conflict-same-id", "stale-reservation"


def finding(code: str, run_id: str) -> Finding:
    return Finding.objects.get(code=code, run__run_id=run_id, closed_at__isnull=True)


def conflict() -> Finding:
    return finding("submission_conflict", CONFLICT_RUN)


def stale() -> Finding:
    return finding("stale_reservation", STALE_RUN)


def conflict_again(run_dir) -> None:
    """The runtime resumes the demo's conflict run and sends the same id a third request."""
    runtime.run_set_state(run_dir, state="retrying", attempts=2)
    runtime.write_task(run_dir, login_request(recipient="SEC", subject="Rotate keys"), "conflict-submission")


def open_kinds(**kwargs) -> set[tuple[str, str]]:
    return {(item.kind, item.run_id) for item in inbox.inbox_items(**kwargs)}


@pytest.fixture
def confirmer(user):
    return join(user, "confirmer")


@pytest.fixture
def deciding(client, confirmer):
    client.force_login(confirmer)
    return client


# --- the rules (evidence/review/triage.py), on both databases -------------------------------------


def test_an_acknowledged_finding_leaves_the_open_inbox_is_listed_under_its_own_and_comes_back(demo, confirmer):
    now = protocol.utc_now()
    triage.act(finding=conflict(), user=confirmer, action=triage.ACKNOWLEDGE, reason="the client retried", now=now)
    assert (inbox.CONFLICT, CONFLICT_RUN) not in open_kinds()
    assert inbox.inbox_total() == 4 == sum(inbox.inbox_counts().values())
    [item] = inbox.inbox_items(view=triage.ACKNOWLEDGED)
    assert (item.kind, item.triage, item.triage_by, item.triage_reason) == (
        inbox.CONFLICT, "acknowledged", "alice", "the client retried"
    )  # fmt: skip
    assert inbox.triage_counts() == {"acknowledged": 1, "snoozed": 0}
    assert inbox.inbox_items(view=triage.SNOOZED) == []
    triage.act(finding=conflict(), user=confirmer, action=triage.UNACKNOWLEDGE, reason="it happened again", now=now)
    assert (inbox.CONFLICT, CONFLICT_RUN) in open_kinds() and inbox.inbox_total() == 5
    entries = AuditEntry.objects.filter(run__run_id=CONFLICT_RUN).order_by("id")
    assert [(e.action, e.actor, e.reason, e.subject) for e in entries] == [
        ("finding_acknowledged", "alice", "the client retried", "submission_conflict: submission conflict-submission"),
        ("finding_unacknowledged", "alice", "it happened again", "submission_conflict: submission conflict-submission"),
    ]


def test_a_snooze_until_a_time_ends_at_that_time_with_nothing_running(demo, confirmer):
    now = protocol.utc_now()
    until = now + dt.timedelta(hours=1)
    triage.act(finding=stale(), user=confirmer, action=triage.SNOOZE, reason="the owner is on it", until=until, now=now)
    assert (inbox.STALE, STALE_RUN) not in open_kinds(now=now)
    assert [item.triage_until for item in inbox.inbox_items(view=triage.SNOOZED, now=now)] == [until]
    later = until + dt.timedelta(seconds=1)
    assert (inbox.STALE, STALE_RUN) in open_kinds(now=later)
    assert inbox.inbox_items(view=triage.SNOOZED, now=later) == []
    [item] = [i for i in inbox.inbox_items(now=later) if i.kind == inbox.STALE]
    assert item.triage == "" and item.triage_by == "", "a snooze that is over reads as open"
    assert inbox.inbox_counts(now=later)[inbox.STALE] == 1 and inbox.inbox_counts(now=now)[inbox.STALE] == 0


def test_a_snooze_until_it_changes_ends_when_the_import_sees_a_new_conflict(demo, confirmer):
    now = protocol.utc_now()
    triage.act(finding=conflict(), user=confirmer, action=triage.SNOOZE, reason="wait for the next", on_change=True,
               now=now)  # fmt: skip
    importer.run_import(path=demo / CONFLICT_RUN, force=True)
    assert conflict().triage == "snoozed", "an import that finds the same conflict leaves the snooze"
    conflict_again(demo / CONFLICT_RUN)
    importer.run_import(path=demo / CONFLICT_RUN)
    assert (inbox.CONFLICT, CONFLICT_RUN) in open_kinds()
    row = conflict()
    assert (row.triage, row.triage_by, row.triage_reason) == ("", "", "")
    ended = AuditEntry.objects.get(action=AuditEntry.TRIAGE_ENDED)
    assert ended.actor == "import" and "it changed (detail, recomputed_value)" in ended.reason
    assert ended.subject == row.label


def test_a_snooze_until_a_time_is_not_ended_by_a_change(demo, confirmer):
    now = protocol.utc_now()
    until = now + dt.timedelta(days=1)
    triage.act(finding=conflict(), user=confirmer, action=triage.SNOOZE, reason="after the release", until=until,
               now=now)  # fmt: skip
    conflict_again(demo / CONFLICT_RUN)
    importer.run_import(path=demo / CONFLICT_RUN)
    assert conflict().triage == "snoozed" and not AuditEntry.objects.filter(action=AuditEntry.TRIAGE_ENDED).exists()


def test_a_stale_reservation_snoozed_until_it_changes_comes_back_when_its_age_class_does(demo, confirmer):
    now = protocol.utc_now()
    row = stale()
    triage.act(finding=row, user=confirmer, action=triage.SNOOZE, reason="owner asked", on_change=True, now=now)
    row.refresh_from_db()
    submission = Submission.objects.get(run__run_id=STALE_RUN, record_key=row.record_key)
    since = submission.updated_at or submission.reserved_at
    assert since is not None
    assert row.triage_on_change and row.triage_until is not None
    # The end of its current age class: the first boundary still ahead, every one before it passed.
    age = row.triage_until - since
    assert age in triage.AGE_CLASSES and row.triage_until > now
    assert all(since + earlier <= now for earlier in triage.AGE_CLASSES[: triage.AGE_CLASSES.index(age)])
    assert (inbox.STALE, STALE_RUN) not in open_kinds(now=now)
    assert (inbox.STALE, STALE_RUN) in open_kinds(now=row.triage_until)


def test_a_finding_that_closed_and_opens_again_loses_its_triage(demo, confirmer):
    now = protocol.utc_now()
    row = conflict()
    triage.act(finding=row, user=confirmer, action=triage.ACKNOWLEDGE, reason="known", now=now)
    Finding.objects.filter(pk=row.pk).update(closed_at=now)
    record = FindingRecord(row.code, row.subject, row.detail, stored_value=row.stored_value,
                           recomputed_value=row.recomputed_value, scope=row.scope)  # fmt: skip
    storing.store_findings(Run.objects.get(run_id=CONFLICT_RUN), [record], now)
    row.refresh_from_db()
    assert (row.closed_at, row.triage) == (None, "")
    assert "it had closed, and opened again" in AuditEntry.objects.get(action=AuditEntry.TRIAGE_ENDED).reason


@pytest.mark.parametrize(
    ("action", "kwargs", "field", "status"),
    [
        (triage.ACKNOWLEDGE, {"reason": "  "}, "reason", HTTPStatus.BAD_REQUEST),
        (triage.ACKNOWLEDGE, {"reason": "x" * 2001}, "reason", HTTPStatus.BAD_REQUEST),
        (triage.SNOOZE, {"reason": "later"}, "snooze", HTTPStatus.BAD_REQUEST),
        (triage.SNOOZE, {"reason": "later", "until": dt.datetime(2000, 1, 1, tzinfo=dt.UTC)}, "until",
         HTTPStatus.BAD_REQUEST),
        (triage.UNACKNOWLEDGE, {"reason": "undo"}, "", HTTPStatus.CONFLICT),
        (triage.UNSNOOZE, {"reason": "undo"}, "", HTTPStatus.CONFLICT),
        ("delete", {"reason": "why not"}, "action", HTTPStatus.BAD_REQUEST),
    ],
)  # fmt: skip
def test_what_cannot_be_recorded_is_refused_and_nothing_is_written(demo, confirmer, action, kwargs, field, status):
    with pytest.raises(triage.TriageError) as refused:
        triage.act(finding=conflict(), user=confirmer, action=action, now=protocol.utc_now(), **kwargs)
    assert (refused.value.field, refused.value.status) == (field, status) and refused.value.message
    assert conflict().triage == "" and not AuditEntry.objects.exists()


def test_a_closed_finding_is_not_triaged(demo, confirmer):
    row = conflict()
    Finding.objects.filter(pk=row.pk).update(closed_at=protocol.utc_now())
    with pytest.raises(triage.TriageError, match="closed") as refused:
        triage.act(finding=row, user=confirmer, action=triage.ACKNOWLEDGE, reason="known", now=protocol.utc_now())
    assert refused.value.status == HTTPStatus.CONFLICT


def test_the_findings_and_stale_lists_filter_by_triage(demo, confirmer):
    now = protocol.utc_now()
    triage.act(finding=stale(), user=confirmer, action=triage.ACKNOWLEDGE, reason="known", now=now)
    stale_open = [item["run_id"] for item in listings.stale(now=now).items()]
    assert STALE_RUN not in stale_open
    [acknowledged] = list(listings.stale(view=triage.ACKNOWLEDGED, now=now).items())
    assert (acknowledged["run_id"], acknowledged["triage"], acknowledged["triage_by"]) == (STALE_RUN, "acknowledged",
                                                                                          "alice")  # fmt: skip
    found = [item["code"] for item in listings.findings(run_id=STALE_RUN, view=triage.ACKNOWLEDGED).items()]
    assert found == ["stale_reservation"]
    assert "stale_reservation" not in [item["code"] for item in listings.findings(run_id=STALE_RUN).items()]


# --- the pages ---------------------------------------------------------------------------------


def act_url(row: Finding) -> str:
    return reverse("triage_action", args=[row.pk])


def test_acknowledge_and_undo_on_the_page_with_the_state_shown_on_every_list(deciding, demo):
    row = conflict()
    form = {"action": "acknowledge", "reason": "the client <b>retried</b>", "next": "/inbox/?kind=conflict"}
    response = deciding.post(act_url(row), form)
    assert response.status_code == HTTPStatus.SEE_OTHER and response["Location"] == "/inbox/?kind=conflict"
    page = content(deciding.get("/inbox/?triage=acknowledged"))
    assert '<strong>acknowledged</strong> by <span translate="no">alice</span>' in page
    assert "the client &lt;b&gt;retried&lt;/b&gt;" in page and "</time> ago" not in page  # one "ago", not two
    assert "Undo the acknowledgement" in page and 'title="items that need a person">4</span>' in page
    assert "submission conflict-submission" not in content(deciding.get("/inbox/"))
    findings_page = content(deciding.get(f"/findings/?triage=acknowledged&run={CONFLICT_RUN}"))
    assert '<strong>acknowledged</strong> by <span translate="no">alice</span>' in findings_page
    assert "submission conflict-submission" not in content(deciding.get(f"/findings/?run={CONFLICT_RUN}"))
    triage_page = content(deciding.get(reverse("triage", args=[row.pk])))
    assert "finding_acknowledged" in triage_page and "Undo the acknowledgement" in triage_page
    response = deciding.post(act_url(row), {"action": "unacknowledge", "reason": "it is back", "next": "/inbox/"})
    assert response.status_code == HTTPStatus.SEE_OTHER
    assert "submission conflict-submission" in content(deciding.get("/inbox/"))
    audit = content(deciding.get("/audit/?list=actions"))
    assert "finding_unacknowledged" in audit and "submission_conflict: submission conflict-submission" in audit


@pytest.mark.parametrize("snooze", ["change", "1h", "1d", "7d", "time"])
def test_snooze_and_undo_on_the_page(deciding, demo, snooze):
    row = stale()
    until = (protocol.utc_now() + dt.timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")
    form = {"action": "snooze", "reason": "owner asked", "snooze": snooze, "until": until if snooze == "time" else ""}
    assert deciding.post(act_url(row), form).status_code == HTTPStatus.SEE_OTHER
    row.refresh_from_db()
    assert row.triage == "snoozed" and row.triage_on_change == (snooze == "change")
    if snooze == "time":
        assert row.triage_until is not None and row.triage_until.strftime("%Y-%m-%dT%H:%M") == until
    page = content(deciding.get("/reservations/?triage=snoozed"))
    assert '<strong>snoozed</strong> by <span translate="no">alice</span>' in page and "Undo the snooze" in page
    assert STALE_RUN not in content(deciding.get("/reservations/"))
    assert deciding.post(act_url(row), {"action": "unsnooze", "reason": "now"}).status_code == HTTPStatus.SEE_OTHER
    assert STALE_RUN in content(deciding.get("/reservations/"))
    assert AuditEntry.objects.filter(action__in=["finding_snoozed", "finding_unsnoozed"]).count() == 2


@pytest.mark.parametrize(
    ("form", "field", "message"),
    [
        ({"action": "acknowledge", "reason": ""}, "reason", "This field is required."),
        ({"action": "snooze", "reason": "later"}, "snooze", "Say how long"),
        ({"action": "snooze", "reason": "later", "snooze": "time"}, "until", "Give the time the snooze ends"),
        ({"action": "snooze", "reason": "later", "snooze": "time", "until": "tomorrow"}, "until", "Enter a valid"),
        ({"action": "snooze", "reason": "later", "snooze": "time", "until": "2001-01-01T00:00"}, "until",
         "That time has passed"),
        ({"action": "snooze", "reason": "later", "snooze": "forever"}, "snooze", "Select a valid choice"),
        ({"action": "snooze", "reason": "later", "snooze": "time", "until": "9999-12-31T23:59"}, "until",
         "At most a year ahead"),
    ],
)  # fmt: skip
def test_bad_input_is_a_clear_error_beside_its_field(deciding, demo, form, field, message):
    response = deciding.post(act_url(conflict()), form)
    assert response.status_code == HTTPStatus.BAD_REQUEST
    page = content(response)
    # The error follows its own field's input, before the next field's.
    start = page.index(f'name="{field}"')
    assert message in page[start:] and page.index(message, start) < start + 2500
    assert conflict().triage == "" and not AuditEntry.objects.exists()


def test_an_undo_of_nothing_and_an_unknown_action_say_why(deciding, demo):
    response = deciding.post(act_url(conflict()), {"action": "unsnooze", "reason": "x"})
    assert response.status_code == HTTPStatus.CONFLICT and "is not snoozed" in content(response)
    response = deciding.post(act_url(conflict()), {"action": "delete", "reason": "x"})
    assert response.status_code == HTTPStatus.BAD_REQUEST and "Select a valid choice" in content(response)


def test_the_guards(client, demo, user, settings):
    row = conflict()
    form = {"action": "acknowledge", "reason": "known"}
    client.force_login(user)  # a viewer: browses, may not triage
    assert client.post(act_url(row), form).status_code == HTTPStatus.FORBIDDEN
    page = content(client.get(reverse("triage", args=[row.pk])))
    assert "Triage needs the confirmer role" in page and 'name="reason"' not in page
    join(user, "confirmer")
    assert client.get(act_url(row)).status_code == HTTPStatus.METHOD_NOT_ALLOWED
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post(act_url(row), form).status_code == HTTPStatus.FORBIDDEN
    settings.EVIDENCE_READ_ONLY = True
    assert client.post(act_url(row), form).status_code == HTTPStatus.FORBIDDEN
    assert conflict().triage == "" and not AuditEntry.objects.exists()
    settings.EVIDENCE_READ_ONLY = False
    root = Finding.objects.create(root="/runs", code="not_a_run", subject="stray", severity="warning",
                                  first_seen=protocol.utc_now(), last_seen=protocol.utc_now())  # fmt: skip
    assert client.post(act_url(root), form).status_code == HTTPStatus.NOT_FOUND
    assert client.get(reverse("triage", args=[10**9])).status_code == HTTPStatus.NOT_FOUND


def test_the_way_back_is_a_page_of_this_site(deciding, demo):
    form = {"action": "acknowledge", "reason": "known", "next": "https://evil.example/"}
    response = deciding.post(act_url(conflict()), form)
    assert response.status_code == HTTPStatus.SEE_OTHER and response["Location"] == "/inbox/"


def test_a_bad_triage_filter_is_a_400_on_each_list(deciding, demo):
    for url in ("/inbox/?triage=zzz", "/findings/?triage=zzz", "/reservations/?triage=zzz"):
        assert deciding.get(url).status_code == HTTPStatus.BAD_REQUEST, url


# --- the API ------------------------------------------------------------------------------------


def snoozed_until(item: dict) -> dt.datetime:
    return dt.datetime.fromisoformat(item["triage_until"].replace("Z", "+00:00"))


def test_a_token_with_the_confirmer_role_triages_and_a_viewers_token_may_not(demo, client, django_user_model):
    row = conflict()
    url = f"/api/findings/{row.pk}/triage"
    viewer = new_token(user=join(django_user_model.objects.create_user("reader"), "viewer"), name="ci")
    body = json.dumps({"action": "acknowledge", "reason": "known"})
    refused = client.post(url, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {viewer}")
    assert refused.status_code == HTTPStatus.FORBIDDEN and conflict().triage == ""
    token = new_token(user=join(django_user_model.objects.create_user("bot"), "confirmer"), name="ci")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    answer = client.post(url, body, content_type="application/json", **auth)
    assert answer.status_code == HTTPStatus.OK
    assert (answer.json()["triage"], answer.json()["triage_by"], answer.json()["finding_id"]) == (
        "acknowledged", "bot", row.pk
    )  # fmt: skip
    listed = client.get("/api/inbox?triage=acknowledged", **auth).json()["items"]
    assert [(item["finding_id"], item["triage_reason"]) for item in listed] == [(row.pk, "known")]
    assert row.pk not in [item["finding_id"] for item in client.get("/api/inbox", **auth).json()["items"]]
    until = (protocol.utc_now() + dt.timedelta(hours=3)).isoformat()
    snooze = json.dumps({"action": "snooze", "reason": "x", "until": until})
    snoozed = client.post(url, snooze, content_type="application/json", **auth)
    assert snoozed.status_code == HTTPStatus.OK and snoozed.json()["triage"] == "snoozed"  # instead of acknowledged
    bad = client.post(url, json.dumps({"action": "snooze", "reason": "x"}), content_type="application/json", **auth)
    assert bad.status_code == HTTPStatus.BAD_REQUEST and bad.json()["detail"].startswith("snooze:")
    # A time beyond any page's reading: refused, and every page that shows the finding still answers.
    for far in ("9999-12-31T23:59:59-14:00", (protocol.utc_now() + dt.timedelta(days=400)).isoformat()):
        refused = client.post(url, json.dumps({"action": "snooze", "reason": "x", "until": far}),
                              content_type="application/json", **auth)  # fmt: skip
        assert refused.status_code == HTTPStatus.BAD_REQUEST, far
        assert refused.json()["detail"].startswith("until: At most a year ahead"), refused.json()
    kept = conflict()
    assert kept.triage == "snoozed" and str(kept.triage_until) == str(snoozed_until(snoozed.json())), "unchanged"
    for page in ("/api/runs/conflict-same-id", "/api/findings?triage=snoozed", "/api/inbox?triage=snoozed"):
        assert client.get(page, **auth).status_code == HTTPStatus.OK, page
    naive = json.dumps({"action": "snooze", "reason": "x", "until": "2030-01-01T00:00:00"})
    assert client.post(url, naive, content_type="application/json", **auth).status_code == HTTPStatus.BAD_REQUEST
    undo = json.dumps({"action": "unacknowledge", "reason": "x"})
    assert client.post(url, undo, content_type="application/json", **auth).status_code == HTTPStatus.CONFLICT
    missing = client.post("/api/findings/999999999/triage", body, content_type="application/json", **auth)
    assert missing.status_code == HTTPStatus.NOT_FOUND
    assert AuditEntry.objects.filter(actor="bot").count() == 2


def test_a_session_post_to_the_api_needs_its_csrf_token(demo, confirmer):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(confirmer)
    body = json.dumps({"action": "acknowledge", "reason": "known"})
    response = strict.post(f"/api/findings/{conflict().pk}/triage", body, content_type="application/json")
    assert response.status_code == HTTPStatus.FORBIDDEN and conflict().triage == ""


def test_triage_changes_nothing_of_the_run_but_the_findings_triage(demo, confirmer):
    before = Run.objects.values().get(run_id=CONFLICT_RUN)
    triage.act(finding=conflict(), user=confirmer, action=triage.ACKNOWLEDGE, reason="known", now=protocol.utc_now())
    assert Run.objects.values().get(run_id=CONFLICT_RUN) == before
