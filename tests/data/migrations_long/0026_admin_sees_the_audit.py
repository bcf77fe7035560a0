from django.db import migrations


def refresh_roles(apps, schema_editor):
    """The roles as evidence/lib/roles.py has them now: the admin role gains viewing the audit in
    the admin (0014 made the roles; a database migrated since has them as they were then)."""
    from evidence.lib.roles import ensure_roles_in_migration

    ensure_roles_in_migration(apps)


class Migration(migrations.Migration):
    dependencies = [
        ("receipts", "0025_triage"),
    ]

    operations = [migrations.RunPython(refresh_roles, migrations.RunPython.noop)]
