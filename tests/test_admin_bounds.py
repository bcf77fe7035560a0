"""The admin role manages people within its bounds, through the admin's own forms: it adds
people, (de)activates them and gives them the four roles, and can give nobody more than
that, itself included. Each test posts what an attacker holding the role would post."""

from __future__ import annotations

from http import HTTPStatus

import pytest
from django.contrib.auth.models import Group, Permission
from django.urls import reverse

from evidence.lib.roles import ROLES
from evidence.models import AuditEntry, Run
from receipts import protocol
from tests.helpers import admin_change_form, join

PASSWORD = "a-long-password-1"


@pytest.fixture
def mallory(django_user_model):
    """An admin, and nothing more: no staff flag, no superuser."""
    return join(django_user_model.objects.create_user("mallory", password=PASSWORD), "admin")


@pytest.fixture
def admin_client(client, mallory):
    client.force_login(mallory)
    return client


@pytest.fixture
def root(django_user_model):
    return django_user_model.objects.create_superuser("root", password="the-root-password-1")


@pytest.fixture
def bob(django_user_model):
    return join(django_user_model.objects.create_user("bob", password="bobs-own-password-1"), "viewer")


def change_url(user) -> str:
    return reverse("admin:auth_user_change", args=[user.pk])


def test_the_role_opens_the_admin_without_a_staff_flag(admin_client):
    assert admin_client.get(reverse("admin:index")).status_code == HTTPStatus.OK
    page = admin_client.get(reverse("admin:auth_user_add"))
    assert page.status_code == HTTPStatus.OK


def test_an_admin_adds_a_person_gives_them_a_role_and_deactivates_them(admin_client, django_user_model):
    added = admin_client.post(
        reverse("admin:auth_user_add"),
        {"username": "carol", "usable_password": "true", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert added.status_code == HTTPStatus.FOUND
    carol = django_user_model.objects.get(username="carol")
    confirmer = Group.objects.get(name="confirmer")
    saved = admin_client.post(change_url(carol), admin_change_form(carol, groups=[confirmer.pk]))
    assert saved.status_code == HTTPStatus.FOUND, saved.content[:2000]
    carol.refresh_from_db()
    assert carol.has_perm("receipts.confirm_call") and carol.is_active
    form = admin_change_form(carol)
    del form["is_active"]
    admin_client.post(change_url(carol), form)
    carol.refresh_from_db()
    assert not carol.is_active


def test_an_admin_cannot_set_superuser_staff_permissions_or_a_group_that_is_not_a_role(admin_client, bob):
    outsider = Group.objects.create(name="everything")
    outsider.permissions.set(Permission.objects.all())
    every_permission = list(Permission.objects.values_list("pk", flat=True))
    admin_client.post(
        change_url(bob),
        admin_change_form(bob, is_superuser="on", is_staff="on", user_permissions=every_permission),
    )
    bob.refresh_from_db()
    assert not bob.is_superuser and not bob.is_staff and not bob.user_permissions.exists()
    refused = admin_client.post(change_url(bob), admin_change_form(bob, groups=[outsider.pk]))
    assert refused.status_code == HTTPStatus.OK  # the form again, with its error
    assert not bob.groups.filter(name="everything").exists()
    page = admin_client.get(change_url(bob)).content.decode()
    for field in ("is_superuser", "is_staff", "user_permissions", "everything"):
        assert f'name="{field}"' not in page and ">everything<" not in page


def test_an_admin_cannot_touch_itself(admin_client, mallory):
    groups = [group.pk for group in Group.objects.filter(name__in=ROLES)]
    response = admin_client.post(change_url(mallory), admin_change_form(mallory, groups=groups, is_superuser="on"))
    assert response.status_code == HTTPStatus.FORBIDDEN
    mallory.refresh_from_db()
    assert set(mallory.groups.values_list("name", flat=True)) == {"admin"} and not mallory.is_superuser
    assert admin_client.post(reverse("admin:auth_user_delete", args=[mallory.pk]), {"post": "yes"}).status_code == 403
    # Its own password goes through the admin's own page, which asks for the old one.
    own = admin_client.post(
        reverse("admin:password_change"),
        {"old_password": PASSWORD, "new_password1": "a-new-long-password-2", "new_password2": "a-new-long-password-2"},
    )
    assert own.status_code == HTTPStatus.FOUND
    mallory.refresh_from_db()
    assert mallory.check_password("a-new-long-password-2")


def test_an_admin_cannot_see_change_or_delete_a_superuser(admin_client, root):
    listing = admin_client.get(reverse("admin:auth_user_changelist")).content.decode()
    assert "root" not in listing
    admin_client.post(change_url(root), admin_change_form(root, username="pwned", is_active=""))
    admin_client.post(reverse("admin:auth_user_delete", args=[root.pk]), {"post": "yes"})
    root.refresh_from_db()
    assert root.username == "root" and root.is_active and root.is_superuser


@pytest.mark.parametrize("whose", ["root", "bob", "mallory"])
def test_an_admin_cannot_set_anyones_password_from_the_user_form(admin_client, whose, request):
    """Setting another's password is taking over their account (and signing the audit as them)."""
    target = request.getfixturevalue(whose)
    before = target.password
    response = admin_client.post(
        reverse("admin:auth_user_password_change", args=[target.pk]),
        {"password1": "taken-over-password-9", "password2": "taken-over-password-9", "usable_password": "true"},
    )
    assert response.status_code in (HTTPStatus.FORBIDDEN, HTTPStatus.NOT_FOUND)
    target.refresh_from_db()
    assert target.password == before


def test_the_bulk_delete_is_not_offered_to_an_admin(admin_client, bob, root):
    listing = admin_client.get(reverse("admin:auth_user_changelist")).content.decode()
    assert "delete_selected" not in listing
    admin_client.post(
        reverse("admin:auth_user_changelist"),
        {"action": "delete_selected", "_selected_action": [bob.pk, root.pk], "post": "yes"},
    )
    assert type(bob).objects.filter(pk__in=[bob.pk, root.pk]).count() == 2


def test_a_superuser_keeps_djangos_whole_user_admin(client, root, bob):
    client.force_login(root)
    page = client.get(change_url(bob)).content.decode()
    assert 'name="is_superuser"' in page and 'name="user_permissions"' in page
    client.post(change_url(bob), admin_change_form(bob, is_staff="on"))
    bob.refresh_from_db()
    assert bob.is_staff


def test_the_admin_login_lets_in_the_role_and_no_one_else(client, mallory, bob):
    login = reverse("admin:login")
    refused = client.post(login, {"username": "bob", "password": "bobs-own-password-1"})
    assert refused.status_code == HTTPStatus.OK and "_auth_user_id" not in client.session, "a viewer stays out"
    let_in = client.post(login, {"username": "mallory", "password": PASSWORD, "next": reverse("admin:index")})
    assert let_in.status_code == HTTPStatus.FOUND and client.get(reverse("admin:index")).status_code == HTTPStatus.OK


@pytest.mark.django_db
def test_the_admin_role_reads_the_audit_in_the_admin_and_changes_nothing(admin_client, demo):
    """The docs promised it; the role lacked the two view permissions, so the admin hid both."""
    run = Run.objects.get(run_id="clean-run")
    entry = AuditEntry.objects.create(run=run, actor="sam", action="legal_hold_set", at=protocol.utc_now())
    index = admin_client.get(reverse("admin:index")).content.decode()
    assert reverse("admin:receipts_auditentry_changelist") in index
    assert reverse("admin:receipts_humandecision_changelist") in index
    listing = admin_client.get(reverse("admin:receipts_auditentry_changelist"))
    assert listing.status_code == HTTPStatus.OK and b"legal_hold_set" in listing.content
    assert admin_client.get(reverse("admin:receipts_humandecision_changelist")).status_code == HTTPStatus.OK
    change, delete = (reverse(f"admin:receipts_auditentry_{act}", args=[entry.pk]) for act in ("change", "delete"))
    assert admin_client.post(change, {"actor": "mallory"}).status_code == HTTPStatus.FORBIDDEN
    assert admin_client.post(delete, {"post": "yes"}).status_code == HTTPStatus.FORBIDDEN
    assert AuditEntry.objects.get(pk=entry.pk).actor == "sam"
