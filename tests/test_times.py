"""One way to show time: every page, and every message built for a person, says a time as
``2026-12-03 06:49:32 UTC``; the exact RFC 3339 instant stays in attributes for machines and
tooltips; an age says "… ago" and comes from the thing it is the age of."""

from __future__ import annotations

import datetime as dt
import html
import re
from http import HTTPStatus

import pytest
from django.urls import reverse
from django.utils import translation

from evidence.ingest import importer
from evidence.models import Call, Finding, HumanDecision, Run
from evidence.retention import plans
from evidence.review import inbox
from evidence.templatetags import dashboard
from evidence.words import i18n
from receipts import protocol, runtime
from tests.helpers import content, import_as_seen_later, join

pytestmark = pytest.mark.django_db

RAW = re.compile(r"\d{4}-\d\d-\d\dT\d\d:")
HUMAN = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")
# Where a machine reads the exact instant: the <time> element's datetime, and its tooltip.
ATTRIBUTES = re.compile(r'\s(?:datetime|title)="[^"]*"')


def raw_times(page: str) -> list[str]:
    """Each raw RFC 3339 time a person would read on ``page``, with a little context."""
    text = html.unescape(ATTRIBUTES.sub("", page))
    return [text[max(match.start() - 60, 0) : match.end() + 20] for match in RAW.finditer(text)]


def every_page() -> list[str]:
    """Every page a person reads about the demo: the lists, each run, its replay and each of its calls."""
    urls = ["/", "/inbox/", "/findings/", "/reservations/", "/retention/", "/hosts/", "/audit/", "/search/?q=killed"]
    for run in Run.objects.order_by("run_id"):
        urls += [reverse("run", args=[run.run_id]), reverse("replay", args=[run.run_id])]
        for submission in run.submissions.all():
            urls.append(reverse("run", args=[run.run_id]) + f"?submission={submission.client_submission_id}")
        urls += [reverse("call", args=[run.run_id, call.call_id]) for call in run.calls.all()]
    return urls


@pytest.fixture
def admin(client, django_user_model):
    """Someone who sees every page and every form (the settle form, the legal hold, exports)."""
    ada = django_user_model.objects.create_user("ada", password="a-long-password-1")
    client.force_login(join(ada, "admin", "confirmer", "exporter"))
    return client


def test_no_page_shows_a_raw_time(admin, demo):
    # A settled call too: its decision, its audit entry.
    call = Call.objects.get(run__run_id="write-file-killed")
    form = {"confirm_call_id": call.call_id[:12], "receipt_sha256": call.file_sha256, "confirm_queryable": "on"}
    form |= {"resolution": "committed", "reason": "the file is there"}
    assert admin.post(reverse("confirm", args=["write-file-killed", call.call_id]), form).status_code == 303
    shown = {}
    for url in every_page():
        response = admin.get(url)
        assert response.status_code == HTTPStatus.OK, url
        page = content(response)
        if found := raw_times(page):
            shown[url] = found
    assert shown == {}


@pytest.mark.parametrize("url", ["/", "/inbox/", "/findings/", "/retention/"])
def test_the_lists_show_the_human_format(admin, demo, url):
    page = html.unescape(content(admin.get(url)))
    assert HUMAN.search(ATTRIBUTES.sub("", page)), url


def test_the_runs_list_says_how_long_ago_each_run_was_active(admin, demo, monkeypatch):
    run = Run.objects.get(run_id="clean-run")
    assert run.last_event_at is not None
    monkeypatch.setenv("RECEIPTS_CLOCK", protocol.format_time(run.last_event_at + dt.timedelta(minutes=3, seconds=5)))
    page = content(admin.get("/"))
    assert f'{dashboard.when(run.last_event_at)} <span class="age">{dashboard.age(run.last_event_at)}</span>' in page
    assert ">3 min ago</time>" in page


def test_the_findings_say_how_long_ago_they_were_first_seen(admin, demo, monkeypatch):
    finding = Finding.objects.filter(run__run_id="conflict-same-id").order_by("pk")[0]
    monkeypatch.setenv("RECEIPTS_CLOCK", protocol.format_time(finding.first_seen + dt.timedelta(hours=5, minutes=1)))
    page = content(admin.get("/findings/"))
    assert f'{dashboard.when(finding.first_seen)} <span class="age">{dashboard.age(finding.first_seen)}</span>' in page
    assert ">5 h 1 min ago</time>" in page


def test_the_age_of_a_stale_reservation_is_the_reservations(admin, demo, monkeypatch):
    """The demo's reservation was made two hours before the demo ran; its finding was seen at an
    import after (the inbox said "just now" for a reservation two hours old)."""
    submission = Run.objects.get(run_id="stale-reservation").submissions.get()
    reserved = submission.updated_at or submission.reserved_at
    assert reserved is not None
    finding = Finding.objects.get(code="stale_reservation")
    assert finding.first_seen - reserved > dt.timedelta(hours=2)
    [item] = inbox.inbox_items(kind=inbox.STALE)
    assert item.since == reserved
    monkeypatch.setenv("RECEIPTS_CLOCK", protocol.format_time(finding.first_seen + dt.timedelta(minutes=1)))
    page = content(admin.get("/inbox/?kind=stale+reservation"))
    assert str(dashboard.age(reserved)) in page
    assert re.search(r">2 h \d+ min ago</time>", page)


def test_an_age_says_ago_with_the_time_in_its_tooltip(monkeypatch):
    monkeypatch.setenv("RECEIPTS_CLOCK", "2026-11-30T12:00:00Z")
    now = protocol.utc_now()
    moment = now - dt.timedelta(hours=3, minutes=12)
    assert str(dashboard.age(moment)) == (
        '<time datetime="2026-11-30T08:48:00.000000Z" title="2026-11-30 08:48:00 UTC">3 h 12 min ago</time>'
    )
    assert ">30 s ago<" in dashboard.age(now - dt.timedelta(seconds=30))
    assert ">2 d 5 h ago<" in dashboard.age(now - dt.timedelta(days=2, hours=5))
    assert ">just now<" in dashboard.age(now + dt.timedelta(seconds=2)), "a clock a little ahead is now"
    assert ">in 20 min<" in dashboard.age(now + dt.timedelta(minutes=20)), "never a future time said as past"
    assert dashboard.age(None) == "unknown"


def test_one_function_formats_a_time_for_people():
    moment = dt.datetime(2026, 12, 3, 7, 49, 32, 75386, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert protocol.human_time(moment) == "2026-12-03 06:49:32 UTC"
    assert protocol.human_time("2026-12-03T06:49:32.075386Z") == "2026-12-03 06:49:32 UTC"
    assert protocol.human_time(dt.datetime(1, 1, 1, tzinfo=dt.UTC)) == "0001-01-01 00:00:00 UTC"
    # A record is data: what is not a time is shown as it is, never an error.
    assert protocol.human_time("yesterday") == "yesterday" and protocol.human_time(7) == "7"
    assert f">{protocol.human_time(moment)}</time>" in dashboard.when(moment)


def test_a_time_said_again_is_said_in_the_language_of_its_page():
    """A shown time is remembered once formatted (a row says its time and its age's tooltip):
    never across languages, and the same instant in another zone is the same time."""
    moment = dt.datetime(2026, 12, 3, 6, 49, 32, tzinfo=dt.UTC)
    with translation.override("en"):
        assert i18n.shown_time(moment) == "2026-12-03 06:49:32 UTC"
    with translation.override("zh-hans"):
        assert i18n.shown_time(moment) == "2026年12月3日 06:49:32 UTC"
        assert i18n.shown_time(moment.astimezone(dt.timezone(dt.timedelta(hours=8)))) == "2026年12月3日 06:49:32 UTC"
    with translation.override("en"):
        assert i18n.shown_time(moment) == "2026-12-03 06:49:32 UTC"


def test_a_finding_detail_says_its_time_for_people(demo):
    [detail] = Finding.objects.filter(code="stale_reservation").values_list("detail", flat=True)
    submission = Run.objects.get(run_id="stale-reservation").submissions.get()
    assert f"since {protocol.human_time(submission.updated_at or submission.reserved_at)};" in detail
    assert not RAW.search(detail)


def test_retention_says_why_with_the_time_for_people(demo):
    policy = plans.RetentionPolicy(strip_after=dt.timedelta(days=7), archive_after=dt.timedelta(days=30))
    now = protocol.utc_now()
    reasons: dict[str, str] = {}
    for later in (now, now + dt.timedelta(days=8), now + dt.timedelta(days=31)):
        reasons |= {plan.action: plan.reason for plan in plans.plan_runs(policy=policy, now=later)}
    assert set(reasons) == set(plans.ACTIONS)
    for reason in reasons.values():
        assert not RAW.search(reason), reason
    assert HUMAN.search(reasons[plans.KEEP] + reasons[plans.STRIP_BODIES] + reasons[plans.ARCHIVE])


def test_the_doubt_evidence_says_when_a_message_was_sent_for_people(admin, demo):
    call = Call.objects.get(run__run_id="send-message-killed")
    page = content(admin.get(reverse("call", args=["send-message-killed", call.call_id])))
    assert re.search(r"sent at (<[^>]+>)*\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", page)


def test_the_409_of_a_second_decision_says_its_time_for_people(client, demo, django_user_model):
    client.force_login(join(django_user_model.objects.create_user("carol", password="a-long-password-1"), "confirmer"))
    call = Call.objects.get(run__run_id="send-message-killed")
    url = reverse("confirm", args=["send-message-killed", call.call_id])
    form = {"confirm_call_id": call.call_id[:12], "receipt_sha256": call.file_sha256}
    first = client.post(url, form | {"resolution": "committed", "reason": "the mail log shows it"})
    assert first.status_code == HTTPStatus.SEE_OTHER
    other = client.post(url, form | {"resolution": "rejected", "reason": "no, it did not"})
    assert other.status_code == HTTPStatus.CONFLICT
    page = content(other)
    decided = HumanDecision.objects.get().decided_at
    assert f"carol already settled this call as committed at {protocol.human_time(decided)}:" in page
    assert not raw_times(page)


def test_the_409_of_a_decision_already_in_the_run_directory_says_its_time_for_people(client, demo, django_user_model):
    """Someone settled the call with the writer's command line first: the run directory's time is shown for people."""
    client.force_login(join(django_user_model.objects.create_user("carol", password="a-long-password-1"), "confirmer"))
    call = Call.objects.get(run__run_id="send-message-killed")
    runtime.confirm_call(
        demo / "send-message-killed",
        call.call_id,
        resolution="rejected",
        reason="no such message",
        actor="bob",
        receipt_sha256=call.file_sha256,
        confirmed_at="2026-11-30T12:00:00.123456Z",
    )
    url = reverse("confirm", args=["send-message-killed", call.call_id])
    form = {"confirm_call_id": call.call_id[:12], "receipt_sha256": call.file_sha256}
    response = client.post(url, form | {"resolution": "committed", "reason": "the mail log shows it"})
    assert response.status_code == HTTPStatus.CONFLICT
    page = content(response)
    assert "bob settled this call as rejected at 2026-11-30 12:00:00 UTC (no such message)" in page
    assert not raw_times(page)


def test_a_host_and_a_call_say_how_long_ago_they_reported(admin, demo, monkeypatch):
    monkeypatch.setenv("RECEIPTS_CLOCK", protocol.format_time(protocol.utc_now() + dt.timedelta(hours=1)))
    call = Call.objects.get(run__run_id="send-message-killed")
    for url in ("/hosts/", reverse("call", args=["send-message-killed", call.call_id])):
        page = content(admin.get(url))
        assert re.search(r'UTC</time> <span class="age"><time [^>]*>[^<]* ago</time></span>', page), url


def test_a_finding_stored_with_the_old_format_takes_the_new_one_when_its_run_is_read_again(demo):
    finding = Finding.objects.get(code="stale_reservation")
    Finding.objects.filter(pk=finding.pk).update(detail="state reserved since 2026-12-03T04:49:32.000000Z; task")
    import_as_seen_later(demo)
    assert RAW.search(Finding.objects.get(pk=finding.pk).detail), "an unchanged run is not read again"
    importer.root_import(root=demo, now=protocol.utc_now() + dt.timedelta(minutes=20), force=True)
    detail = Finding.objects.get(pk=finding.pk).detail
    assert detail == finding.detail and not RAW.search(detail)
