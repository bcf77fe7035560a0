"""Who may do what: four roles, each a group of permissions. One table, read by the data
migration that makes the groups, by `demo_login`, and by the tests.

Every role browses. The others add one kind of act each, so that a person is
given exactly what they do (least privilege): deciding about problems (settling a
call, and triaging findings: acknowledging or snoozing one, with a reason),
exporting evidence, or administering (legal holds, users). A person may hold
several roles.
Retention is applied on the server (`manage.py apply_retention`, or the worker's daily task), not from a page.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.core.exceptions import PermissionDenied

BROWSE = "receipts.browse"
TRIAGE = "receipts.triage_finding"
ROLES: dict[str, tuple[str, ...]] = {
    "viewer": (BROWSE,),
    # The person who decides a call in doubt also decides that a finding can wait (triage).
    "confirmer": (BROWSE, "receipts.confirm_call", TRIAGE),
    "exporter": (BROWSE, "receipts.export_evidence"),
    "admin": (
        BROWSE,
        "receipts.set_legal_hold",
        "auth.view_user", "auth.add_user", "auth.change_user", "auth.delete_user", "auth.view_group",
        # The audit, read-only in the admin as on /audit/ (its admin refuses every change).
        "receipts.view_humandecision", "receipts.view_auditentry",
        # Who is told of the inbox's items, and where (/notifications/): a webhook is an outbound request.
        "receipts.manage_notifications",
    ),
}  # fmt: skip


class MissingPermission(PermissionDenied):
    """Refused for want of one permission: the 403 page names the roles that hold it."""

    def __init__(self, permission: str) -> None:
        super().__init__(permission)
        self.permission = permission


def requires(permission: str) -> Callable[[Callable], Callable]:
    """Django's ``permission_required(..., raise_exception=True)``, with the permission kept on the
    refusal, so that the page can say which role gives it (``roles_with``) and who can give one."""

    def decorate(view: Callable) -> Callable:
        @functools.wraps(view)
        def guarded(request: Any, *args: Any, **kwargs: Any) -> Any:
            if not request.user.has_perm(permission):
                raise MissingPermission(permission)
            return view(request, *args, **kwargs)

        return guarded

    return decorate


def roles_with(permission: str) -> list[str]:
    """The roles that hold ``permission``, in the table's order."""
    return [role for role, permissions in ROLES.items() if permission in permissions]


def ensure_roles(apps: Any = None) -> dict[str, Any]:
    """Make the four groups with exactly their permissions (again, if a test's flush emptied
    them); ``apps``: a migration's historical models, which lack the permissions later
    migrations add (those call this again)."""
    from django.apps import apps as installed

    registry = installed if apps is None else apps
    group_model, permission_model = registry.get_model("auth", "Group"), registry.get_model("auth", "Permission")
    groups = {}
    for role, names in ROLES.items():
        group, _ = group_model.objects.get_or_create(name=role)
        wanted = []
        for name in names:
            app_label, codename = name.split(".")
            found = permission_model.objects.filter(content_type__app_label=app_label, codename=codename).first()
            if found is None and apps is None:
                raise LookupError(f"no permission {name}: a role names one no model declares")
            if found is not None:
                wanted.append(found)
        group.permissions.set(wanted)
        groups[role] = group
    return groups


def ensure_roles_in_migration(apps: Any) -> dict[str, Any]:
    """``ensure_roles`` from a data migration: Django makes permissions only after every migration
    has run, so the ones the roles name are made first, from the migration's own models."""
    from django.contrib.auth.management import create_permissions

    for label in ("auth", "receipts"):
        app_config = apps.get_app_config(label)
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    return ensure_roles(apps)


def role_givers() -> list[Any]:
    """The active people who may give a role: the admin role's members and superusers, for the
    page a login with no role sees."""
    from django.contrib.auth import get_user_model
    from django.db.models import Q

    people = get_user_model()._default_manager.filter(is_active=True)
    return list(people.filter(Q(groups__name="admin") | Q(is_superuser=True)).distinct().order_by("username"))
