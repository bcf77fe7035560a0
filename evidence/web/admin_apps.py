"""The admin app, with the site of evidence/web/admin_site.py (kept apart: this module is imported
with the settings, before any model may be)."""

from __future__ import annotations

from django.contrib.admin.apps import AdminConfig


class RoleAdminConfig(AdminConfig):
    default_site = "evidence.web.admin_site.RoleAdminSite"
