"""A form refused by the CSRF check (posted from an old tab, after logging in again) gets the
site's page, not Django's bare one, and what the person typed is not lost. Nothing is done."""

from __future__ import annotations

import re
from http import HTTPStatus

import pytest
from django.test import Client
from django.urls import reverse

from evidence.models import AuditEntry, HumanDecision, Run
from tests.helpers import first_call_of, join

pytestmark = pytest.mark.django_db
REASON = "the mail log shows <it> went out at 02:14"


def csrf_checking_client(user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get(reverse("runs"))  # the page gives this browser its CSRF cookie
    return client


def new_token(html: str) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert found, "the page offers no form with a token"
    return found.group(1)


def test_a_settle_from_an_old_page_comes_back_filled_in_to_send_again(demo, django_user_model):
    client = csrf_checking_client(join(django_user_model.objects.create_user("cleo"), "confirmer"))
    call = first_call_of("send-message-killed")
    url = reverse("confirm", args=["send-message-killed", call.call_id])
    typed = {"resolution": "committed", "reason": REASON, "confirm_call_id": call.call_id[:12],
             "receipt_sha256": call.file_sha256, "csrfmiddlewaretoken": "a-token-from-a-page-now-gone" * 2}  # fmt: skip
    page = client.post(url, typed)
    assert page.status_code == HTTPStatus.FORBIDDEN
    html = page.content.decode()
    assert "this form came from a page that is out of date" in html and "CSRF verification failed" not in html
    assert not HumanDecision.objects.exists(), "a refused form did nothing"
    assert re.search(r'<input type="radio" name="resolution" value="committed"[^>]*checked', html)
    assert "the mail log shows &lt;it&gt; went out at 02:14</textarea>" in html, "the reason, escaped, kept"
    retype = re.search(r'<input[^>]*name="confirm_call_id"[^>]*>', html)
    assert retype and "value=" not in retype.group(0), "the call_id is typed again: no one-click resend"
    assert 'aria-label="Main"' in html, "the site's page, with its navigation"
    # Sent again from that page, with its fresh token, it settles.
    resent = client.post(url, {**typed, "csrfmiddlewaretoken": new_token(html)})
    assert resent.status_code == HTTPStatus.SEE_OTHER
    assert HumanDecision.objects.get().reason == REASON


def test_a_legal_hold_from_an_old_page_keeps_its_reason_and_links_back(demo, django_user_model):
    client = csrf_checking_client(join(django_user_model.objects.create_user("ada"), "admin"))
    page = client.post(reverse("legal_hold", args=["clean-run"]), {"hold": "set", "reason": REASON})
    assert page.status_code == HTTPStatus.FORBIDDEN
    html = page.content.decode()
    assert "the mail log shows &lt;it&gt; went out at 02:14</textarea>" in html
    assert f'href="{reverse("run", args=["clean-run"])}"' in html and "Open the form again" in html
    assert not Run.objects.filter(legal_hold=True).exists() and not AuditEntry.objects.exists()


def test_a_form_posted_after_the_session_ended_asks_for_a_login_first(demo):
    client = Client(enforce_csrf_checks=True)
    client.get(reverse("login"))
    page = client.post(reverse("legal_hold", args=["clean-run"]), {"hold": "set", "reason": REASON})
    assert page.status_code == HTTPStatus.FORBIDDEN
    html = page.content.decode()
    assert "Log in again" in html and "next=%2Fruns%2Fclean-run%2F" in html
    assert "went out at 02:14</textarea>" in html, "kept for the person, once logged in"


def test_a_login_with_no_role_refused_by_csrf_sees_the_no_role_page(demo, django_user_model):
    client = csrf_checking_client(django_user_model.objects.create_user("newcomer"))
    page = client.post(reverse("legal_hold", args=["clean-run"]), {"hold": "set", "reason": REASON})
    assert page.status_code == HTTPStatus.FORBIDDEN and b"You have no role yet" in page.content
