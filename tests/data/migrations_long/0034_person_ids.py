"""Records of who acted keep the person's id when the account goes (evidence/models.py, PERSON_ID),
an act on a person is about no run, and older rows that lost their person get them back where
the name says who it was without doubt."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def name_people_by_id(apps, schema_editor):
    """A row with no person (its account removed before ids were kept, or written without one) is
    given the account of its name when exactly one has it and it existed when the row was written:
    an account made later (the name taken again) did not act then. Commands' rows ("import",
    "apply_retention") match no account and stay without one."""
    user_model = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    for model_name, when in (("HumanDecision", "decided_at"), ("AuditEntry", "at")):
        model = apps.get_model("receipts", model_name)
        for actor in model.objects.filter(user__isnull=True).values_list("actor", flat=True).distinct():
            accounts = list(user_model.objects.filter(username=actor).values_list("pk", "date_joined")[:2])
            if len(accounts) != 1:
                continue
            [(pk, joined)] = accounts
            model.objects.filter(user__isnull=True, actor=actor, **{f"{when}__gte": joined}).update(user_id=pk)


def person() -> models.ForeignKey:
    """A record's person: their id, kept when the account goes (models.PERSON_ID, as of now)."""
    return models.ForeignKey(
        db_constraint=False,
        null=True,
        on_delete=django.db.models.deletion.DO_NOTHING,
        related_name="+",
        to=settings.AUTH_USER_MODEL,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("receipts", "0033_host_copy_removal"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name="auditentry",
            name="run",
            field=models.ForeignKey(
                null=True, on_delete=django.db.models.deletion.PROTECT, related_name="audit_entries", to="receipts.run"
            ),
        ),
        migrations.AlterField(
            model_name="auditentry",
            name="user",
            field=person(),
        ),
        migrations.AlterField(
            model_name="humandecision",
            name="user",
            field=person(),
        ),
        migrations.RunPython(name_people_by_id, migrations.RunPython.noop),
    ]
