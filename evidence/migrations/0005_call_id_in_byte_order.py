# A call's id compared as its bytes on PostgreSQL too (models.ByteOrderCharField): a database made
# with a language's collation sorted "a9..." outside the range "a9" to "a:", and a re-import missed
# what changed in such a bucket. PostgreSQL rebuilds the indexes on the column; SQLite's text is
# compared as bytes already (BINARY), and its table is not made again for nothing.

from django.db import migrations

import evidence.models


class AlterFieldOnPostgreSQL(migrations.AlterField):
    """``AlterField`` for the state everywhere, and for the schema on PostgreSQL alone."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    dependencies = [
        ("receipts", "0004_confirmation_made_on_host"),
    ]

    operations = [
        AlterFieldOnPostgreSQL(
            model_name="call",
            name="call_id",
            field=evidence.models.ByteOrderCharField(max_length=200),
        ),
    ]
