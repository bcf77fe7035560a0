"""Every run's stored counts again: a call in doubt now counts as "in doubt" (or "disputed"),
not as its receipt's word ("prepared", "unknown"), since one table says what a call shows as
(``receipts.states``, issue 37)."""

from django.db import migrations


def count_again(apps, schema_editor):
    from evidence.lib import stats

    for run in apps.get_model("receipts", "Run").objects.iterator(chunk_size=500):
        stats.refresh_run_summary(run, apps=apps)


class Migration(migrations.Migration):
    dependencies = [
        ("receipts", "0035_verbose_names"),
    ]

    operations = [
        migrations.RunPython(count_again, migrations.RunPython.noop, elidable=True),
    ]
