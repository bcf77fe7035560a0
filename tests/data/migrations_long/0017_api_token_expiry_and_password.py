"""API tokens get an optional expiry, and the fingerprint of their owner's password: a
token made before a password change stops working. Tokens made before this migration take
the fingerprint of the password their owner has now."""

import hashlib

from django.db import migrations, models


def fingerprint_existing_tokens(apps, schema_editor):
    ApiToken = apps.get_model("receipts", "ApiToken")
    for token in ApiToken.objects.select_related("user").iterator():
        # evidence.web.api.password_fingerprint as it is at this migration (a migration keeps its own copy).
        token.password_fingerprint = hashlib.sha256(token.user.password.encode()).hexdigest()
        token.save(update_fields=["password_fingerprint"])


class Migration(migrations.Migration):
    dependencies = [
        ("receipts", "0016_receipt_event_status"),
    ]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="expires_at",
            field=models.DateTimeField(null=True),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="password_fingerprint",
            field=models.CharField(default="", max_length=64),
        ),
        migrations.RunPython(fingerprint_existing_tokens, migrations.RunPython.noop),
    ]
