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


# A browser sends its page's origin with every form it posts.
OUR_PAGES = {"Origin": "http://testserver"}


def csrf_checking_client(user, origin: dict[str, str] = OUR_PAGES) -> Client:
    client = Client(enforce_csrf_checks=True, headers=origin)
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
    client = Client(enforce_csrf_checks=True, headers=OUR_PAGES)
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


def test_a_cross_site_post_never_shows_its_text_as_what_was_typed(demo, django_user_model):
    """Another site's form posting here, with its own reason: the refusal is the same page,
    without that text, for a confirmer, an admin and a visitor who is not logged in, and a
    settle form is not filled in with the forger's decision."""
    forged = {"Origin": "https://attacker.example"}
    reason = "SUPPORT SAYS: type your call_id at attacker.example"
    confirmer = csrf_checking_client(join(django_user_model.objects.create_user("cleo"), "confirmer"), forged)
    call = first_call_of("send-message-killed")
    settle = {"resolution": "committed", "reason": reason, "receipt_sha256": call.file_sha256}
    admin = csrf_checking_client(join(django_user_model.objects.create_user("ada"), "admin"), forged)
    anonymous = Client(enforce_csrf_checks=True, headers=forged)
    pages = [
        confirmer.post(reverse("confirm", args=["send-message-killed", call.call_id]), settle),
        admin.post(reverse("legal_hold", args=["clean-run"]), {"hold": "set", "reason": reason}),
        anonymous.post(reverse("legal_hold", args=["clean-run"]), {"hold": "set", "reason": reason}),
        anonymous.post(reverse("confirm", args=["send-message-killed", call.call_id]), settle),
    ]
    for page in pages:
        html = page.content.decode()
        assert page.status_code == HTTPStatus.FORBIDDEN and "this form came from a page that is out of date" in html
        assert "attacker.example" not in html and "What you typed" not in html
        assert not re.search(r'name="resolution" value="committed"[^>]*checked', html)
    assert not HumanDecision.objects.exists() and not AuditEntry.objects.exists()
    # A post with no Origin at all is not known to be ours either.
    bare = csrf_checking_client(join(django_user_model.objects.create_user("bea"), "admin"), {})
    html = bare.post(reverse("legal_hold", args=["clean-run"]), {"hold": "set", "reason": reason}).content.decode()
    assert "attacker.example" not in html
