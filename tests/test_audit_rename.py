"""No account can be given a name under which the audit records another person.

The audit keeps each act's person by id beside the name they had then, and says when they have
been renamed since (tests/test_people_audit.py). That alone let an admin rename carol away and
then rename bob to "carol": bob's acts from then on read "carol" beside carol's own, told apart
by an id a reader must compare. The admin's forms (a person added or renamed, by the admin role
or a superuser) now refuse a name that the audit records for another person, or that another
account has, up to capitals; a person may take back a name of their own. Every rename is audited.
"""

from __future__ import annotations

from http import HTTPStatus

import pytest
from django.test import Client
from django.urls import reverse

from evidence.models import AuditEntry, HumanDecision
from tests.helpers import admin_change_form, content, first_call_of, join, settle_form

pytestmark = pytest.mark.django_db

SENT = "send-message-killed"  # one of the demo's calls in doubt
PASSWORD = "a-long-password-1"
REFUSED = "The audit names another person"


def settle(client: Client, run_id: str) -> HumanDecision:
    call = first_call_of(run_id)
    response = client.post(reverse("confirm", args=[run_id, call.call_id]), settle_form(call, confirm_queryable="on"))
    assert response.status_code == HTTPStatus.SEE_OTHER, content(response)[:2000]
    return HumanDecision.objects.get(run__run_id=run_id)


def rename(client: Client, user, name: str):
    return client.post(reverse("admin:auth_user_change", args=[user.pk]), admin_change_form(user, username=name))


def renames() -> list[str]:
    return list(
        AuditEntry.objects.filter(action=AuditEntry.PERSON_RENAMED).order_by("id").values_list("subject", flat=True)
    )


@pytest.fixture
def carol(django_user_model):
    return join(django_user_model.objects.create_user("carol", password=PASSWORD), "confirmer")


@pytest.fixture
def bob(django_user_model):
    return join(django_user_model.objects.create_user("bob", password=PASSWORD), "confirmer")


@pytest.fixture
def mallory(django_user_model):
    """An admin, and nothing more."""
    return join(django_user_model.objects.create_user("mallory", password=PASSWORD), "admin")


@pytest.fixture
def as_admin(mallory) -> Client:
    client = Client()
    client.force_login(mallory)
    return client


def test_an_admin_cannot_rename_someone_to_a_name_the_audit_records_for_another(demo, carol, bob, as_admin):
    settler = Client()
    settler.force_login(carol)
    decision = settle(settler, SENT)
    assert (decision.actor, decision.user_id) == ("carol", carol.pk)

    moved = rename(as_admin, carol, "carol-old")  # a rename as such is allowed, and audited
    assert moved.status_code == HTTPStatus.FOUND, content(moved)[:2000]
    for taken in ("carol", "Carol", "CAROL"):
        refused = rename(as_admin, bob, taken)
        assert refused.status_code == HTTPStatus.OK  # the form again, with its error
        assert REFUSED in content(refused) and taken in content(refused)
        bob.refresh_from_db()
        assert bob.username == "bob"
    added = as_admin.post(
        reverse("admin:auth_user_add"),
        {"username": "carol", "usable_password": "true", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert added.status_code == HTTPStatus.OK and REFUSED in content(added)
    assert renames() == [f"#{carol.pk} carol → carol-old"]

    # carol may have her own name back: the audit's "carol" is her.
    carol.refresh_from_db()
    back = rename(as_admin, carol, "carol")
    assert back.status_code == HTTPStatus.FOUND, content(back)[:2000]
    assert renames() == [f"#{carol.pk} carol → carol-old", f"#{carol.pk} carol-old → carol"]
    audit = content(as_admin.get(reverse("audit")))
    assert f'<span translate="no">carol</span> <span class="muted person-id">#{carol.pk}</span></td>' in audit


def test_no_account_takes_another_accounts_name_up_to_capitals(carol, bob, as_admin):
    refused = rename(as_admin, bob, "Carol")
    assert refused.status_code == HTTPStatus.OK and REFUSED in content(refused)
    bob.refresh_from_db()
    assert bob.username == "bob" and renames() == []
    # A name nobody has and the audit does not know is given, and the rename audited.
    given = rename(as_admin, bob, "robert")
    assert given.status_code == HTTPStatus.FOUND, content(given)[:2000]
    assert renames() == [f"#{bob.pk} bob → robert"]


def test_a_superuser_is_refused_the_name_as_well(demo, carol, bob, django_user_model):
    settler = Client()
    settler.force_login(carol)
    settle(settler, SENT)
    root = Client()
    root.force_login(django_user_model.objects.create_superuser("root", password="the-root-password-1"))
    form = {"username": "carol-old", "first_name": "", "last_name": "", "email": "", "is_active": "on",
            "date_joined_0": "2026-12-01", "date_joined_1": "00:00:00", "_save": "Save"}  # fmt: skip
    assert root.post(reverse("admin:auth_user_change", args=[carol.pk]), form).status_code == HTTPStatus.FOUND
    refused = root.post(reverse("admin:auth_user_change", args=[bob.pk]), form | {"username": "carol"})
    assert refused.status_code == HTTPStatus.OK and REFUSED in content(refused)
    bob.refresh_from_db()
    assert bob.username == "bob"
