"""A run's stored count of calls in doubt now follows the one rule (``protocol.in_doubt``: the
call's recovery decision), which also counts altered, disputed, legacy and missing receipts:
the runs imported before it are counted again, from their rows (no run directory is read)."""

from django.db import migrations


def count_again(apps, schema_editor):
    from evidence import stats

    for run in apps.get_model("receipts", "Run").objects.all():
        stats.refresh_run_summary(run, apps=apps)


class Migration(migrations.Migration):
    dependencies = [
        ("receipts", "0017_api_token_expiry_and_password"),
    ]

    operations = [
        migrations.RunPython(count_again, migrations.RunPython.noop),
    ]
