"""The test database between tests: what a transactional test leaves is gone for the next one.

On PostgreSQL the flush that ends a transactional test deletes rows instead of truncating
(``tests/conftest.py``, ``deleting_flush``): this holds it to what Django's own flush promises,
on both databases, with rows whose foreign keys point every way.
"""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.utils import timezone

from evidence.models import AuditEntry, Call, Event, Finding, Run
from tests.helpers import import_as_seen_later, join


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
