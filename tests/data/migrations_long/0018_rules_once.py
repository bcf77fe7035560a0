"""Every rule once (issue 20).

- A run's stored count of calls in doubt follows the one rule (``protocol.in_doubt``: the
  call's recovery decision), which also counts altered, disputed, legacy and missing receipts.
- Retention's facts are kept with the summary (when the clock started, whether anything keeps
  the run, what its bodies weigh), so the retention page pages and filters by key.
- The runs list and the open findings are paged by key on indexes of their order.

The runs imported before it are counted again from their rows (no run directory is read).
"""

from django.db import migrations, models


def count_again(apps, schema_editor):
    from evidence.lib import stats

    for run in apps.get_model("receipts", "Run").objects.all():
        stats.refresh_run_summary(run, apps=apps)


class Migration(migrations.Migration):
    dependencies = [
        ("receipts", "0017_api_token_expiry_and_password"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="finding", name="receipts_fi_closed__aef272_idx"),
        migrations.RemoveIndex(model_name="run", name="receipts_ru_last_ev_3933fd_idx"),
        migrations.AddField(model_name="run", name="body_bytes", field=models.BigIntegerField(default=0)),
        migrations.AddField(model_name="run", name="retention_blocked", field=models.BooleanField(default=False)),
        migrations.AddField(model_name="run", name="retention_clock_from", field=models.DateTimeField(null=True)),
        migrations.AddIndex(
            model_name="finding",
            index=models.Index(fields=["closed_at", "code", "id"], name="finding_open_code_idx"),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["last_event_at", "run_id"], name="run_activity_idx"),
        ),
        migrations.RunPython(count_again, migrations.RunPython.noop),
    ]
