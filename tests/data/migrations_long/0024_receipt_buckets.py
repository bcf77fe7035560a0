# A run's receipts by bucket, so that a re-import reads what changed (importer.receipt_buckets).
# Runs imported before have none: their next import reads them whole and records their buckets.

from django.db import migrations

import evidence.models


class Migration(migrations.Migration):
    dependencies = [
        ("receipts", "0023_hot_set"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="receipt_buckets",
            field=evidence.models.JSONTextField(default=dict),
        ),
    ]
