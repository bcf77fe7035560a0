"""No 500 from what a person can post in a form: hypothesis fills every dashboard form (a settle,
a triage, a legal hold, the login) with text of any kind (NULs, other control characters,
surrogate-free Unicode, text past each field's limit), values near the right ones (the call's
own id and digest, each act, each snooze) and times of any year, in any zone, on both
databases. Bounded and derandomized, so CI's runs repeat and stay short."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence.models import Finding
from evidence.review import triage
from evidence.web import forms
from tests.helpers import first_call_of, join

pytestmark = pytest.mark.django_db(transaction=True)  # a failed statement must not spoil a test transaction

EXAMPLES = 40  # posts a form

TEXT = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=triage.REASON_LIMIT - 2, max_size=triage.REASON_LIMIT + 2),
    st.just("\x00"),
    st.text(alphabet="a\x00\r\n\t ", max_size=10),
)
# The form's field is naive, in UTC (the page says so): any year it can spell.
MOMENT = st.datetimes(min_value=dt.datetime.min, max_value=dt.datetime.max).map(  # noqa: DTZ901
    lambda moment: moment.strftime("%Y-%m-%dT%H:%M").rjust(16, "0")
)


def field(*right: str) -> st.SearchStrategy[str]:
    """A posted field: one of the values a page offers, or anything."""
    return st.one_of(st.sampled_from(right), TEXT) if right else TEXT


def form(**fields: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, str]]:
    """Some of the fields, each of any value: a field may be missing, as from a hand-made post."""
    return st.fixed_dictionaries({}, optional=fields)


def posts_without_a_500(client: Client, url: str, data: st.SearchStrategy[dict[str, str]]) -> None:
    failures: list[str] = []

    @given(posted=data)
    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    def post(posted: dict[str, str]) -> None:
        response = client.post(url, posted)
        if response.status_code >= 500:
            failures.append(f"{url} {posted!r}: {response.status_code}")

    post()
    assert failures == []


@pytest.fixture
def person(demo, django_user_model) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(join(django_user_model.objects.create_user("fuzzer"), "viewer", "confirmer", "admin"))
    return client


def test_no_settle_post_is_a_500(person):
    call = first_call_of("send-message-killed")
    url = f"/runs/send-message-killed/calls/{call.call_id}/confirm/"
    posts_without_a_500(person, url, form(
        resolution=field("committed", "rejected"), reason=field("checked the target"),
        confirm_call_id=field(call.call_id[:12], call.call_id), receipt_sha256=field(call.file_sha256),
        confirm_queryable=field("on"),
    ))  # fmt: skip


def test_no_triage_post_is_a_500(person):
    finding = Finding.objects.filter(run__isnull=False, closed_at__isnull=True).order_by("pk")[0]
    posts_without_a_500(person, f"/findings/{finding.pk}/triage/act/", form(
        action=field(*triage.ACTIONS), reason=field("known"), snooze=field(*forms.SNOOZES),
        until=st.one_of(MOMENT, TEXT), next=field("/findings/", "//evil.example/"),
    ))  # fmt: skip


def test_no_legal_hold_post_is_a_500(person):
    posts_without_a_500(person, "/runs/clean-run/hold/", form(hold=field("set", "lift"), reason=field("court order")))


def test_no_login_post_is_a_500(db):
    """Anonymous, through django-axes, which counts each failure in its own table."""
    posts_without_a_500(Client(raise_request_exception=False), "/accounts/login/",
                        form(username=field("alice"), password=field("a-long-password-1")))  # fmt: skip
