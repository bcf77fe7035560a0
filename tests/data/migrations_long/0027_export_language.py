"""An export keeps the language of the person who asked for it: the worker writes its page in it."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("receipts", "0026_admin_sees_the_audit"),
    ]

    operations = [
        migrations.AddField(
            model_name="export",
            name="language",
            field=models.CharField(blank=True, default="", max_length=16),
        ),
    ]
