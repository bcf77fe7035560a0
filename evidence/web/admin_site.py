"""The admin site: its door opens to the admin role, not to a staff flag only a superuser can set."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _

from evidence.web.forms import BoundedLogin


def may_administer(user) -> bool:
    # The admin role manages people (evidence/lib/roles.py); staff status stays Django's, for superusers.
    return user.is_active and (user.is_staff or user.has_perm("auth.change_user"))


class RoleAdminLoginForm(BoundedLogin, AdminAuthenticationForm):
    """The admin's own login asks what its door asks, not the staff flag."""

    def confirm_login_allowed(self, user) -> None:
        if not may_administer(user):
            raise ValidationError(self.error_messages["invalid_login"], code="invalid_login",
                                  params={"username": self.username_field.verbose_name})  # fmt: skip


class RoleAdminSite(admin.AdminSite):
    site_header = _("Callproof administration")
    site_title = _("Callproof administration")
    login_form = RoleAdminLoginForm

    def has_permission(self, request) -> bool:
        return may_administer(request.user)
