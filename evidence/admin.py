"""The admin: the audit of human decisions, read-only; and people, managed by the admin role
within its bounds.

A superuser sees Django's own user admin. Anyone else who may change users (the admin
role) may add people, (de)activate them and give them the four roles, and nothing that
would give anyone more: no superuser or staff flag, no raw permission, no group but a
role, no change to a superuser (they are not even listed), to themselves (their own
password goes through the admin's "change password" page), or to another person's
password (that would be taking over their account, and signing the audit as them). Nobody,
a superuser included, gives an account a name under which the audit records another person
(``people.reads_as_another``).
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.forms import AdminUserCreationForm, UserChangeForm
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils.translation import gettext_lazy as _

from evidence.lib import people
from evidence.lib.roles import ROLES
from evidence.models import AuditEntry, Host, HumanDecision


class ReadOnlyAdmin(admin.ModelAdmin):
    """Audit rows are shown, never added, changed or deleted."""

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(HumanDecision)
class HumanDecisionAdmin(ReadOnlyAdmin):
    list_display = ("decided_at", "actor", "user_id", "run", "call_id", "resolution")
    list_filter = ("resolution",)
    search_fields = ("actor", "call_id", "run__run_id")


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor", "user_id", "run", "action", "subject")
    list_filter = ("action",)
    search_fields = ("actor", "run__run_id")


@admin.register(Host)
class HostAdmin(ReadOnlyAdmin):
    """Hosts register themselves; a person may only retire one that will never report again, so
    that its silence stops being an inbox item (it keeps its runs, which no other host imports)."""

    list_display = ("name", "watching", "last_seen_at", "stopped_at", "runs_root", "version")
    actions = ("retire",)

    @admin.action(description=_("Retire: stop expecting these hosts to report"), permissions=["retire"])
    def retire(self, request, queryset):
        queryset.update(watching=False)

    def has_retire_permission(self, request) -> bool:
        return request.user.is_superuser


def _name_of_no_one_else(name: str | None, person_id: int | None) -> str | None:
    if name and people.reads_as_another(name, person_id):
        raise ValidationError(
            _(
                "The audit names another person “%(name)s”, or another account has that name (capitals "
                "aside): an account given it would read as them. Choose another name."
            ),
            code="name_of_another",
            params={"name": name},
        )
    return name


class PersonChangeForm(UserChangeForm):
    def clean_username(self) -> str | None:
        name = self.cleaned_data.get("username")
        return _name_of_no_one_else(name, self.instance.pk) if "username" in self.changed_data else name


class PersonCreationForm(AdminUserCreationForm):
    def clean_username(self) -> str:
        name = super().clean_username()
        _name_of_no_one_else(name, None)
        return name


def _bounded(request) -> bool:
    return not request.user.is_superuser


class PeopleAdmin(UserAdmin):
    """Django's user admin for superusers; within the admin role's bounds for everyone else. For
    both, a name the audit knows as another person's is refused (``PersonChangeForm``)."""

    form = PersonChangeForm
    add_form = PersonCreationForm

    bounded_fieldsets = (
        (None, {"fields": ("username",)}),
        (_("Personal info"), {"fields": ("first_name", "last_name", "email")}),
        (_("Access"), {"fields": ("is_active", "groups")}),
        (_("Important dates"), {"fields": ("last_login", "date_joined")}),
    )

    def get_queryset(self, request):
        people = super().get_queryset(request)
        return people.filter(is_superuser=False) if _bounded(request) else people

    def get_fieldsets(self, request, obj=None):
        if obj is None or not _bounded(request):
            return super().get_fieldsets(request, obj)
        # The form is built from these fields only: a posted is_superuser, is_staff or
        # user_permissions is not a field of it, so it is never read.
        return self.bounded_fieldsets

    def get_readonly_fields(self, request, obj=None):
        return ("last_login", "date_joined") if obj is not None and _bounded(request) else ()

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        if db_field.name == "groups" and _bounded(request):
            kwargs["queryset"] = Group.objects.filter(name__in=ROLES)
        return super().formfield_for_manytomany(db_field, request, **kwargs)

    def has_change_permission(self, request, obj=None):
        if obj is not None and _bounded(request) and (obj.is_superuser or obj.pk == request.user.pk):
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        if obj is not None and _bounded(request) and (obj.is_superuser or obj.pk == request.user.pk):
            return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request):
        actions = super().get_actions(request)
        if _bounded(request):
            # The bulk delete checks the permission once, not for each person it deletes.
            actions.pop("delete_selected", None)
        return actions

    # A rename or a removal is audited as the act of the person signed in (evidence/lib/people.py).
    def save_model(self, request, obj, form, change):
        with people.acting(request.user):
            super().save_model(request, obj, form, change)

    def delete_model(self, request, obj):
        with people.acting(request.user):
            super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        with people.acting(request.user):
            super().delete_queryset(request, queryset)

    def user_change_password(self, request, id, form_url=""):
        if _bounded(request):
            raise PermissionDenied
        return super().user_change_password(request, id, form_url)


admin.site.unregister(get_user_model())
admin.site.register(get_user_model(), PeopleAdmin)
