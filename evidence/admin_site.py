"""The admin site: its door opens to the admin role, not to a staff flag only a superuser can set."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig


class RoleAdminSite(admin.AdminSite):
    site_header = "Callproof administration"
    site_title = "Callproof administration"

    def has_permission(self, request) -> bool:
        # The admin role manages people (receipts/roles.py); staff status stays Django's, for superusers.
        user = request.user
        return user.is_active and (user.is_staff or user.has_perm("auth.change_user"))


class RoleAdminConfig(AdminConfig):
    default_site = "evidence.admin_site.RoleAdminSite"
