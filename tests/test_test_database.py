"""The test database between tests: what a transactional test leaves is gone for the next one, and
the demo runs' rows put back are those a real import makes.

On PostgreSQL the flush that ends a transactional test deletes rows instead of truncating
(``tests/conftest.py``, ``deleting_flush``): this holds it to what Django's own flush promises,
on both databases, with rows whose foreign keys point every way.
"""

from __future__ import annotations

import os

import pytest
from django.apps import apps
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from evidence.models import AuditEntry, Call, Event, Finding, Run
from tests.helpers import import_as_seen_later, join
from tests.imported_demo import ImportedDemo, every_model


@pytest.mark.django_db(transaction=True)
def test_a_flush_empties_every_table_and_makes_the_permissions_again(demo_root, django_user_model):
    import_as_seen_later(demo_root)
    person = join(django_user_model.objects.create_user("flushed", password="a-long-password-1"), "admin")
    AuditEntry.objects.create(run=Run.objects.first(), user=person, actor=person.username, at=timezone.now(),
                              action=AuditEntry.LEGAL_HOLD_SET)  # fmt: skip
    assert Run.objects.exists() and Call.objects.exists() and Event.objects.exists() and Finding.objects.exists()
    permissions = Permission.objects.count()

    call_command("flush", verbosity=0, interactive=False, reset_sequences=False, allow_cascade=False)

    left = {model._meta.label: model._default_manager.count() for model in apps.get_models()
            if model not in (Permission, ContentType) and model._meta.managed}  # fmt: skip
    assert {label: rows for label, rows in left.items() if rows} == {}
    assert Permission.objects.count() == permissions  # made again after the flush, as after a migration


def every_row() -> dict[str, list[dict]]:
    return {model._meta.label: list(model._base_manager.order_by("pk").values()) for model in every_model()}


def test_the_demo_put_back_is_the_rows_its_real_import_made_until_its_copy_changes(demo_source, tmp_path, db):
    imported = ImportedDemo(demo_source, tmp_path)
    with transaction.atomic():
        root = imported.for_this_test()
        made = every_row()
        transaction.set_rollback(True)
    assert made["receipts.Run"] and not Run.objects.exists()

    with transaction.atomic():
        assert imported.for_this_test() == root and imported.copies == 1, "put back, not imported again"
        assert every_row() == made  # the file signatures and paths too: a second import reads nothing
        transaction.set_rollback(True)

    with (root / "clean-run" / "events.jsonl").open("ab") as ledger:
        ledger.write(b"")  # the same bytes, a new modification time: a test touched the copy
    os.utime(root / "clean-run" / "events.jsonl")
    assert imported.for_this_test() != root and imported.copies == 2 and not root.exists()
    assert Run.objects.filter(path__startswith=str(imported.root)).count() == len(made["receipts.Run"])
