"""The four roles of evidence/lib/roles.py: a group each, with exactly its permissions.

A change to the roles needs a migration of its own that calls ``ensure_roles_in_migration``
again: a database migrated before it keeps the groups as they were.
"""

from django.core.management.base import CommandError
from django.db import migrations
from django.db.migrations.recorder import MigrationRecorder

# The last of the 37 migrations this one and 0001_initial replaced (0.1.0's chain): a database
# that went all the way through them is this schema; one that stopped before is not.
END_OF_THE_LONG_WAY = "0039_finding_values"


def refuse_a_database_stopped_on_the_long_way(apps, schema_editor):
    """A database migrated part of the way through the migrations before the squash has the old
    ``0001_initial`` recorded, so Django takes the squashed one as applied and its schema would
    stay short of the models (a column missing, found only by a page that fails). Say so instead."""
    connection = schema_editor.connection
    applied = {name for app, name in MigrationRecorder(connection).applied_migrations() if app == "receipts"}
    older = applied - {"0001_initial", "0002_roles"}
    tables = set(connection.introspection.table_names())
    missing = sorted(model._meta.db_table for model in apps.get_app_config("receipts").get_models()
                     if model._meta.db_table not in tables)  # fmt: skip
    if (older and END_OF_THE_LONG_WAY not in older) or (not older and missing):
        last = max(older, default="0001_initial")
        raise CommandError(
            f"this database was migrated part of the way by an earlier Callproof (its last dashboard "
            f"migration: {last}). The dashboard's migrations were squashed into two: migrate it to "
            f"{END_OF_THE_LONG_WAY} with the version that made it first, or start from an empty database "
            "and import the run directories again (they are the record; the database is their index)."
        )


def make_roles(apps, schema_editor):
    from evidence.lib.roles import ensure_roles_in_migration

    ensure_roles_in_migration(apps)


def remove_roles(apps, schema_editor):
    from evidence.lib.roles import ROLES

    apps.get_model("auth", "Group").objects.filter(name__in=list(ROLES)).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("receipts", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(refuse_a_database_stopped_on_the_long_way, migrations.RunPython.noop),
        migrations.RunPython(make_roles, remove_roles),
    ]
