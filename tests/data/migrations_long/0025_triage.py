# Triage (evidence/review/triage.py): a finding's acknowledgement or snooze, the permission the confirmer
# role gets for it, and the audit's subject. A submission conflict found before this release as two
# findings ("submission X" and "submission X digests") becomes the one the reader now makes.

import datetime as dt

from django.db import migrations, models

DIGESTS = " digests"


def give_the_permission(apps, schema_editor):
    from evidence.lib.roles import ensure_roles_in_migration

    ensure_roles_in_migration(apps)


def one_finding_a_conflict(apps, schema_editor):
    finding_model = apps.get_model("receipts", "Finding")
    now = dt.datetime.now(dt.UTC)
    old = finding_model.objects.filter(code="submission_conflict", subject__endswith=DIGESTS, run__isnull=False)
    for digests in old.iterator():
        subject = digests.subject.removesuffix(DIGESTS)
        target = finding_model.objects.filter(run_id=digests.run_id, code=digests.code, subject=subject).first()
        if target is None:
            finding_model.objects.filter(pk=digests.pk).update(subject=subject)
            continue
        if digests.closed_at is None:
            both = target.closed_at is None and target.detail and target.detail != digests.detail
            finding_model.objects.filter(pk=target.pk).update(
                detail=f"{target.detail}; {digests.detail}" if both else digests.detail,
                stored_value=digests.stored_value,
                recomputed_value=digests.recomputed_value,
                closed_at=None,
                last_seen=max(target.last_seen, digests.last_seen),
            )
            finding_model.objects.filter(pk=digests.pk).update(closed_at=now)


class Migration(migrations.Migration):
    dependencies = [
        ("receipts", "0024_receipt_buckets"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="finding",
            options={
                "ordering": ["code", "subject"],
                "permissions": [("triage_finding", "Can acknowledge or snooze a finding, and undo either")],
            },
        ),
        migrations.AddField(
            model_name="auditentry",
            name="subject",
            field=models.CharField(blank=True, default="", max_length=450),
        ),
        migrations.AddField(
            model_name="finding",
            name="triage",
            field=models.CharField(blank=True, default="", max_length=16, db_default=""),
        ),
        migrations.AddField(
            model_name="finding",
            name="triage_at",
            field=models.DateTimeField(null=True),
        ),
        migrations.AddField(
            model_name="finding",
            name="triage_by",
            field=models.CharField(blank=True, default="", max_length=150, db_default=""),
        ),
        migrations.AddField(
            model_name="finding",
            name="triage_on_change",
            field=models.BooleanField(default=False, db_default=False),
        ),
        migrations.AddField(
            model_name="finding",
            name="triage_reason",
            field=models.TextField(blank=True, default="", db_default=""),
        ),
        migrations.AddField(
            model_name="finding",
            name="triage_until",
            field=models.DateTimeField(null=True),
        ),
        migrations.AddIndex(
            model_name="finding",
            index=models.Index(fields=["triage", "triage_until"], name="finding_triage_idx"),
        ),
    ]
