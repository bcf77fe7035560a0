"""The "confirmers" group: people who may settle a call in doubt (permission receipts.confirm_call)."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

GROUP = "confirmers"


def make_group(apps, schema_editor):
    # Permissions are made after migrations run; this one is needed now, so make it here.
    app_config = apps.get_app_config("receipts")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, _ = Group.objects.get_or_create(name=GROUP)
    group.permissions.add(Permission.objects.get(codename="confirm_call", content_type__app_label="receipts"))


def remove_group(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name=GROUP).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("receipts", "0004_human_decision"),
    ]

    operations = [migrations.RunPython(make_group, remove_group)]
