"""The four roles of evidence/roles.py: a group each, with exactly its permissions.

A change to the roles needs a migration of its own that calls ``ensure_roles_in_migration``
again: a database migrated before it keeps the groups as they were.
"""

from django.db import migrations


def make_roles(apps, schema_editor):
    from evidence.roles import ensure_roles_in_migration

    ensure_roles_in_migration(apps)


def remove_roles(apps, schema_editor):
    from evidence.roles import ROLES

    apps.get_model("auth", "Group").objects.filter(name__in=list(ROLES)).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("receipts", "0001_initial"),
    ]

    operations = [migrations.RunPython(make_roles, remove_roles)]
