"""The audit names people by an id no rename changes, with the name they had then: an admin who
renames a person and takes their name with a known password acts under a new id, never theirs.
Renaming and removing people is audited, from the admin or from anywhere else."""

from __future__ import annotations

import json
from http import HTTPStatus

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse

from evidence.models import AuditEntry, HumanDecision
from tests.helpers import admin_change_form, content, first_call_of, join, settle_form

pytestmark = pytest.mark.django_db

SENT, QUERYABLE = "send-message-killed", "write-file-killed"  # the demo's two calls in doubt
PASSWORD = "a-long-password-1"
KNOWN = "the-admin-knows-this-1"


def settle(client: Client, run_id: str) -> None:
    call = first_call_of(run_id)
    response = client.post(reverse("confirm", args=[run_id, call.call_id]), settle_form(call, confirm_queryable="on"))
    assert response.status_code == HTTPStatus.SEE_OTHER, content(response)[:2000]


def who_html(pk: int, name: str) -> str:
    return f'<span translate="no">{name}</span> <span class="muted person-id">#{pk}</span>'


@pytest.fixture
def mallory(django_user_model):
    """An admin, and nothing more: the role the attack needs."""
    return join(django_user_model.objects.create_user("mallory", password=PASSWORD), "admin")


@pytest.fixture
def carol(django_user_model):
    return join(django_user_model.objects.create_user("carol", password=PASSWORD), "confirmer")


def test_an_admin_who_takes_a_persons_name_acts_under_a_new_id_and_the_rename_is_audited(
    demo, carol, mallory, django_user_model
):
    original = Client()
    original.force_login(carol)
    settle(original, SENT)

    admin = Client()
    admin.force_login(mallory)
    carol_page = reverse("admin:auth_user_change", args=[carol.pk])
    renamed = admin.post(carol_page, admin_change_form(carol, username="carol-old"))
    assert renamed.status_code == HTTPStatus.FOUND, content(renamed)[:2000]
    new_person = {"username": "carol", "usable_password": "true", "password1": KNOWN, "password2": KNOWN}
    added = admin.post(reverse("admin:auth_user_add"), new_person)
    # The admin's forms refuse a name the audit records for another (tests/test_audit_rename.py);
    # one who can run code on the server makes the account anyway, and the ids still tell them apart.
    assert added.status_code == HTTPStatus.OK and "The audit names another person" in content(added)
    impostor = django_user_model.objects.create_user("carol", password=KNOWN)
    confirmer = Group.objects.get(name="confirmer").pk
    admin.post(reverse("admin:auth_user_change", args=[impostor.pk]), admin_change_form(impostor, groups=[confirmer]))

    # The new "carol" logs in with the password the admin chose, through the login page.
    second = Client()
    assert second.post(reverse("login"), {"username": "carol", "password": KNOWN}).status_code == HTTPStatus.FOUND
    settle(second, QUERYABLE)

    first, then = HumanDecision.objects.get(run__run_id=SENT), HumanDecision.objects.get(run__run_id=QUERYABLE)
    assert (first.actor, first.user_id) == ("carol", carol.pk) and (then.actor, then.user_id) == ("carol", impostor.pk)
    viewer = Client()
    viewer.force_login(join(django_user_model.objects.create_user("vera", password=PASSWORD), "viewer"))
    audit = content(viewer.get(reverse("audit")))
    renamed_since = ' <span class="muted">(renamed since to <span translate="no">carol-old</span>)'
    assert who_html(carol.pk, "carol") + renamed_since in audit
    assert who_html(impostor.pk, "carol") + "</td>" in audit
    assert f"#{carol.pk} carol → carol-old" in audit and "person_renamed" in audit
    [rename] = AuditEntry.objects.filter(action=AuditEntry.PERSON_RENAMED)
    assert (rename.actor, rename.user_id, rename.run) == ("mallory", mallory.pk, None)
    # The login's save of last_login and the role given are no rename.
    assert not AuditEntry.objects.filter(action=AuditEntry.PERSON_RENAMED).exclude(pk=rename.pk).exists()

    sent_page = content(viewer.get(reverse("call", args=[SENT, first.call_id])))
    assert who_html(carol.pk, "carol") + renamed_since in sent_page
    queryable_page = content(viewer.get(reverse("call", args=[QUERYABLE, then.call_id])))
    assert who_html(impostor.pk, "carol") + " decided at" in queryable_page

    # The "who" filter finds a person by id under every name they had, and no one else of the name.
    by_id = content(viewer.get(reverse("audit"), {"actor": f"#{carol.pk}"}))
    assert f"decision-{first.pk}" in by_id and f"decision-{then.pk}" not in by_id
    downloaded = json.loads(content(viewer.get(reverse("audit") + "?format=json")))
    ids = {(row["run_id"], row["actor"], row["actor_id"]) for row in downloaded["items"]}
    assert ids == {(SENT, "carol", carol.pk), (QUERYABLE, "carol", impostor.pk)}


def test_removing_a_person_is_audited_and_their_decisions_keep_their_id(demo, carol, django_user_model):
    settler = Client()
    settler.force_login(carol)
    settle(settler, SENT)
    root = Client()
    root.force_login(django_user_model.objects.create_superuser("root", password="the-root-password-1"))
    gone = root.post(reverse("admin:auth_user_delete", args=[carol.pk]), {"post": "yes"})
    assert gone.status_code == HTTPStatus.FOUND
    assert HumanDecision.objects.get().user_id == carol.pk  # a foreign key would have set it null
    [removal] = AuditEntry.objects.filter(action=AuditEntry.PERSON_REMOVED)
    assert (removal.actor, removal.subject, removal.run) == ("root", f"#{carol.pk} carol", None)
    audit = content(root.get(reverse("audit")))
    assert who_html(carol.pk, "carol") + ' <span class="muted">(account removed)</span>' in audit
    assert "(a person, no run)" in audit


def test_a_rename_outside_the_admin_is_audited_as_the_command_that_ran(carol):
    carol.username = "carol-renamed"
    carol.save()
    [rename] = AuditEntry.objects.filter(action=AuditEntry.PERSON_RENAMED)
    assert rename.subject == f"#{carol.pk} carol → carol-renamed"
    assert rename.user_id is None and "(system user " in rename.actor
