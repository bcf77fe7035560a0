from django.contrib.auth.management import create_permissions
from django.db import migrations


def refresh_roles(apps, schema_editor):
    """The roles as evidence/roles.py has them now: the admin role gains viewing the audit in
    the admin (0014 made the roles; a database migrated since has them as they were then)."""
    from evidence.roles import ensure_roles

    for label in ("auth", "receipts"):  # permissions are made after migrations run; these are needed now
        app_config = apps.get_app_config(label)
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    ensure_roles(apps)


class Migration(migrations.Migration):
    dependencies = [
        ("receipts", "0025_triage"),
    ]

    operations = [migrations.RunPython(refresh_roles, migrations.RunPython.noop)]
