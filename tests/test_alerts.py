"""Alerts (issue 37): the inbox's items told to a real webhook receiver on 127.0.0.1 and a real
SMTP server (aiosmtpd), once per item, with retries; a receiver that is down or slow; the
worker running the task."""

from __future__ import annotations

import datetime as dt
import io
import mailbox
import socket
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django_tasks_db.models import DBTaskResult

from evidence.models import DeliveryAttempt, Finding, Notification, NotificationRule
from evidence.review import alerts, inbox, triage
from receipts import protocol, states
from tests.helpers import join, until
from tests.subprocess_db import start_worker, this_database_url
from tests.test_smtp import start_server
from tests.webhook_receiver import Receiver, doc_verifier

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "a-shared-secret"


@pytest.fixture(autouse=True)
def loopback(settings):
    settings.EVIDENCE_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.EVIDENCE_PUBLIC_URL = "https://callproof.example.com"
    settings.EVIDENCE_WEBHOOK_TIMEOUT_SECONDS = 1


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver(SECRET).start()
    yield made
    made.stop()


def rule(url: str = "", **fields: object) -> NotificationRule:
    values: dict[str, object] = {"name": "ops", "channel": NotificationRule.WEBHOOK, "url": url, "secret": SECRET,
                                 "created_at": protocol.utc_now()}  # fmt: skip
    return NotificationRule.objects.create(**(values | fields))


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_each_open_item_is_posted_once_signed_with_its_link(demo, receiver):
    rule(receiver.url)
    alerts.run()
    keys = {alerts.key_of(item) for item in inbox.inbox_items()}
    assert len(receiver.posts) == len(keys) == 5
    assert all(post.verified for post in receiver.posts)
    bodies = {(post.json["item"]["kind"], post.json["item"]["run_id"]): post.json for post in receiver.posts}
    doubt = bodies[(inbox.IN_DOUBT, "send-message-killed")]
    call_id = doubt["item"]["subject"]
    link = f"https://callproof.example.com/runs/send-message-killed/calls/{call_id}/"
    assert doubt["type"] == "inbox.item.opened" and doubt["item"]["link"] == link
    assert doubt["item"]["severity"] == "error" and doubt["item"]["state"] == "in doubt"
    # The table of states says it: its glyph and word, and what to do (receipts/states.py).
    assert doubt["item"]["shown"] == "? in doubt" and doubt["item"]["to_do"] == states.STATES["in doubt"].to_do("en")
    assert doubt["text"].startswith("[error] ? in doubt: run send-message-killed") and f"<{link}|open>" in doubt["text"]
    assert "Needs you: nobody knows whether it happened" in doubt["text"]
    conflict = bodies[(inbox.CONFLICT, "conflict-same-id")]
    assert conflict["item"]["link"].endswith(f"/findings/{Finding.objects.get(code='submission_conflict').pk}/triage/")
    # A second pass finds the same items open: nothing more is sent.
    alerts.run()
    alerts.run()
    assert len(receiver.posts) == 5
    assert DeliveryAttempt.objects.filter(outcome=DeliveryAttempt.DELIVERED).count() == 5


def test_the_docs_verifier_refuses_a_changed_body_a_wrong_secret_and_an_old_request():
    verify = doc_verifier()
    now = int(protocol.utc_now().timestamp())
    header = alerts.signature(SECRET, b'{"a": 1}', now)
    assert verify(b'{"a": 1}', header, SECRET)
    assert not verify(b'{"a": 2}', header, SECRET)
    assert not verify(b'{"a": 1}', header, "another secret")
    assert not verify(b'{"a": 1}', alerts.signature(SECRET, b'{"a": 1}', now - 3600), SECRET)
    assert not verify(b'{"a": 1}', "garbage", SECRET)


def test_a_rules_filters_choose_its_items(demo, receiver):
    rule(receiver.url, kinds=inbox.IN_DOUBT, runs="send-*")
    rule(receiver.url, name="warnings", severities="warning")
    rule(receiver.url, name="tool", tools="no_such_tool")
    rule(receiver.url, name="elsewhere", host="another-host")
    alerts.run()
    got = sorted((post.json["item"]["kind"], post.json["item"]["run_id"]) for post in receiver.posts)
    warnings = sorted((item.kind, item.run_id) for item in inbox.inbox_items(severity="warning"))
    assert warnings and got == sorted([(inbox.IN_DOUBT, "send-message-killed"), *warnings])


def test_acknowledged_and_snoozed_findings_are_not_sent_and_a_snooze_that_ends_is_sent_again(
    demo, receiver, django_user_model
):
    person = join(django_user_model.objects.create_user("pat"), "confirmer")
    conflict = Finding.objects.get(code="submission_conflict")
    stale = Finding.objects.get(code="stale_reservation")
    now = protocol.utc_now()
    triage.act(finding=conflict, user=person, action=triage.ACKNOWLEDGE, reason="known", now=now)
    until_ = now + dt.timedelta(hours=1)
    triage.act(finding=stale, user=person, action=triage.SNOOZE, reason="later", until=until_, now=now)
    rule(receiver.url, kinds="\n".join([inbox.CONFLICT, inbox.STALE]))
    alerts.run(now=now)
    assert receiver.posts == []
    # The snooze's hour is over: the item is open again, and told.
    alerts.run(now=until_ + dt.timedelta(seconds=1))
    assert [post.json["item"]["kind"] for post in receiver.posts] == [inbox.STALE]


def test_an_item_that_leaves_and_opens_again_is_told_again_and_one_settled_before_its_try_is_withdrawn(
    demo, receiver, django_user_model
):
    person = join(django_user_model.objects.create_user("pat"), "confirmer")
    conflict = Finding.objects.get(code="submission_conflict")
    made = rule(f"http://127.0.0.1:{closed_port()}/hook", kinds=inbox.CONFLICT)
    now = protocol.utc_now()
    alerts.run(now=now)  # the receiver is down: a failed try
    [pending] = Notification.objects.filter(rule=made)
    assert pending.state == Notification.PENDING and pending.attempts == 1
    triage.act(finding=conflict, user=person, action=triage.ACKNOWLEDGE, reason="known", now=now)
    made.url = receiver.url
    made.save()
    alerts.run(now=now + dt.timedelta(hours=2))
    pending.refresh_from_db()
    assert pending.state == Notification.WITHDRAWN and pending.closed_at is not None and receiver.posts == []
    triage.act(finding=Finding.objects.get(pk=conflict.pk), user=person, action=triage.UNACKNOWLEDGE,
               reason="not known after all", now=now)  # fmt: skip
    alerts.run(now=now + dt.timedelta(hours=3))
    assert len(receiver.posts) == 1 and Notification.objects.filter(rule=made).count() == 2


def test_a_receiver_that_is_down_is_retried_with_backoff_and_gets_it_once_when_it_comes_up(demo, settings):
    port = closed_port()
    made = rule(f"http://127.0.0.1:{port}/hook", kinds=inbox.TAMPERED)
    now = protocol.utc_now()
    alerts.run(now=now)
    [first] = DeliveryAttempt.objects.all()
    assert first.outcome == DeliveryAttempt.FAILED and first.error == "refused" and first.status is None
    assert first.next_at is not None
    assert first.next_at - first.at == dt.timedelta(seconds=settings.EVIDENCE_ALERTS_RETRY_SECONDS)
    alerts.run(now=now + dt.timedelta(seconds=5))  # not due yet: no try
    assert DeliveryAttempt.objects.count() == 1
    alerts.run(now=first.next_at)
    second = DeliveryAttempt.objects.order_by("-pk").first()
    assert second is not None and second.next_at is not None
    assert second.next_at - second.at == dt.timedelta(seconds=2 * settings.EVIDENCE_ALERTS_RETRY_SECONDS)
    up = Receiver(SECRET, port=port).start()
    try:
        alerts.run(now=second.next_at)
        alerts.run(now=second.next_at + dt.timedelta(hours=2))
        assert len(up.posts) == 1 and up.posts[0].verified
    finally:
        up.stop()
    assert Notification.objects.get(rule=made).state == Notification.SENT
    assert list(DeliveryAttempt.objects.order_by("pk").values_list("outcome", flat=True)) == [
        "failed", "failed", "delivered"]  # fmt: skip


def test_a_slow_receiver_times_out_and_is_retried_and_does_not_hold_back_the_others(demo, receiver):
    slow = Receiver(SECRET, delay=3).start()
    try:
        rule(slow.url, name="slow", kinds=inbox.TAMPERED)
        rule(receiver.url, name="fast", kinds=inbox.TAMPERED)
        alerts.run()
        outcomes = dict(DeliveryAttempt.objects.values_list("notification__rule__name", "error"))
        assert outcomes == {"slow": "timeout", "fast": ""}
        assert len(receiver.posts) == 1
        assert Notification.objects.get(rule__name="slow").state == Notification.PENDING
    finally:
        slow.stop()


def test_a_notification_is_given_up_after_its_tries(demo, settings):
    settings.EVIDENCE_ALERTS_MAX_ATTEMPTS = 3
    rule(f"http://127.0.0.1:{closed_port()}/hook", kinds=inbox.TAMPERED)
    moment = protocol.utc_now()
    for _ in range(5):
        alerts.run(now=moment)
        moment += dt.timedelta(hours=2)
    assert list(DeliveryAttempt.objects.order_by("pk").values_list("outcome", flat=True)) == [
        "failed", "failed", "gave_up"]  # fmt: skip
    assert Notification.objects.get().state == Notification.GAVE_UP


def test_a_webhook_may_not_reach_this_machine_unless_allowed_nor_use_another_scheme(demo, receiver, settings):
    settings.EVIDENCE_WEBHOOK_ALLOWED_HOSTS = []
    rule(receiver.url, kinds=inbox.TAMPERED)
    rule("file:///etc/passwd", name="file", kinds=inbox.TAMPERED)
    alerts.run()
    errors = dict(DeliveryAttempt.objects.values_list("notification__rule__name", "error"))
    assert errors == {"ops": "private_address", "file": "scheme"} and receiver.posts == []
    with pytest.raises(alerts.WebhookRefused):
        alerts.check_url("http://169.254.169.254/latest/meta-data/")
    settings.EVIDENCE_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com"]
    with pytest.raises(alerts.WebhookRefused):
        alerts.check_url(receiver.url)


def test_a_redirect_is_not_followed(demo):
    moved = Receiver(SECRET, status=302).start()
    try:
        rule(moved.url, kinds=inbox.TAMPERED)
        alerts.run()
        assert DeliveryAttempt.objects.get().error == "http_302" and len(moved.posts) == 1
    finally:
        moved.stop()


def test_without_a_public_url_a_path_is_sent_and_the_log_says_so(demo, receiver, settings, caplog):
    settings.EVIDENCE_PUBLIC_URL = ""
    rule(receiver.url, kinds=inbox.TAMPERED)
    alerts.run()
    [post] = receiver.posts
    assert post.json["item"]["link"].startswith("/runs/tampered-receipt/calls/")
    assert any(getattr(record, "event", "") == "alerts_no_public_url" for record in caplog.records)


def test_an_email_rule_sends_through_djangos_mail_to_a_real_smtp_server(demo, tmp_path, settings):
    server = start_server(tmp_path / "smtp")
    smtp = next(server)
    try:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp.port
        rule(channel=NotificationRule.EMAIL, emails="ops@example.com\noncall@example.com", kinds=inbox.IN_DOUBT,
             runs="send-*")  # fmt: skip
        alerts.run()
        alerts.run()
        [message] = list(mailbox.Maildir(smtp.maildir, create=False))
        assert message["Subject"] == "[Callproof] in doubt: send-message-killed"
        text = bytes(message.get_payload(decode=True)).decode()
        assert "https://callproof.example.com/runs/send-message-killed/calls/" in text
        assert DeliveryAttempt.objects.get().outcome == DeliveryAttempt.DELIVERED
    finally:
        next(server, None)


def test_an_import_pass_queues_the_task_once_and_a_real_worker_delivers(demo_root, receiver, tmp_path):
    rule(receiver.url, kinds=inbox.IN_DOUBT)
    call_command("import_runs", str(demo_root), stdout=io.StringIO())
    call_command("import_runs", str(demo_root), "--force", stdout=io.StringIO())
    assert DBTaskResult.objects.filter(status="READY").count() == 1  # one waiting, not one a pass
    env = {"EVIDENCE_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1", "EVIDENCE_PUBLIC_URL": "https://callproof.example.com"}
    worker = start_worker(this_database_url(), tmp_path / "worker.log", "--batch", **env)
    assert worker.wait(timeout=300) == 0, (tmp_path / "worker.log").read_text()[-3000:]
    until(lambda: len(receiver.posts) == 2, "the worker's posts")
    assert {post.json["item"]["run_id"] for post in receiver.posts} == {"send-message-killed", "write-file-killed"}
    assert set(DBTaskResult.objects.values_list("status", flat=True)) == {"SUCCESSFUL"}


def test_no_rule_no_task_and_no_scan(demo_root):
    call_command("import_runs", str(demo_root), stdout=io.StringIO())
    assert not DBTaskResult.objects.exists()
    with CaptureQueriesContext(connection) as queries:
        alerts.run()
    assert queries and not [query for query in queries if "receipts_call" in query["sql"]]


def test_the_delivery_log_is_kept_its_days(demo, receiver, settings):
    rule(receiver.url, kinds=inbox.TAMPERED)
    alerts.run()
    later = protocol.utc_now() + dt.timedelta(days=settings.EVIDENCE_ALERTS_LOG_KEEP_DAYS + 1)
    assert alerts.remove_old_log(now=later) == 1 and not DeliveryAttempt.objects.exists()


def test_the_admin_adds_a_rule_on_the_page_and_sees_the_log(demo, receiver, client, django_user_model):
    admin = join(django_user_model.objects.create_user("ada"), "admin")
    client.force_login(admin)
    refused = client.post("/notifications/rules/", {"name": "x", "channel": "webhook", "url": "ftp://h/"})
    assert refused.status_code == 400
    page = refused.content.decode()
    assert "A webhook address starts with http:// or https://." in page and "signed with a secret" in page
    assert not NotificationRule.objects.exists()
    added = client.post("/notifications/rules/", {"name": "<b>ops</b>", "channel": "webhook", "url": receiver.url,
                                                  "secret": SECRET, "kinds": [inbox.TAMPERED]})  # fmt: skip
    assert added.status_code == 303 and added["Location"] == "/notifications/"
    made = NotificationRule.objects.get()
    assert made.created_by == admin and made.kinds == inbox.TAMPERED and made.enabled
    alerts.run()
    page = client.get("/notifications/").content.decode()
    assert "&lt;b&gt;ops&lt;/b&gt;" in page and "<b>ops</b>" not in page and SECRET not in page
    assert "delivered" in page and "HTTP 200" in page
    assert client.post(f"/notifications/rules/{made.pk}/", {"action": "burn"}).status_code == 400
    assert client.post(f"/notifications/rules/{made.pk}/", {"action": "disable"}).status_code == 303
    assert not NotificationRule.objects.get().enabled
    assert client.post(f"/notifications/rules/{made.pk}/", {"action": "delete"}).status_code == 303
    assert not NotificationRule.objects.exists()
