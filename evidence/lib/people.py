"""People as the audit names them, and the audit of what happens to their accounts.

A record of who acted keeps the person's id (``models.PERSON_ID``) beside the name they had then:
a name can be renamed away and taken by a new account with a known password, an id cannot. So
pages show the name then with the id, and say when the person has been renamed since or their
account removed (``who``). Renaming or removing an account, from the admin, ``manage.py`` or
anywhere else, is an audit entry naming the person by id, old name and new (``record_*``). And no
account is given a name under which the audit records another person (``reads_as_another``: the
admin's forms refuse it), so that a rename never makes one person's acts read as another's.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import getpass
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ObjectDoesNotExist
from django.db.models.signals import post_delete, post_save, pre_save

from receipts import protocol

# The person acting in this request (the admin sets it around its saves and deletions); outside a
# request, the command that runs acts (``acting_name``).
_acting: contextvars.ContextVar[Any] = contextvars.ContextVar("acting_person", default=None)


@contextlib.contextmanager
def acting(user: Any) -> Iterator[None]:
    """Whatever changes people inside is audited as ``user``'s act."""
    token = _acting.set(user)
    try:
        yield
    finally:
        _acting.reset(token)


def acting_name() -> str:
    """Who the audit says acted when no person did: the command and the system account running it."""
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:2]]) if sys.argv else "python"
    try:
        account = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's)
        account = "?"
    return f"{command} (system user {account})"


def label(pk: int, name: str) -> str:
    """A person as an audit entry's subject names them: their id first, which no rename changes."""
    return f"#{pk} {name}"


@dataclasses.dataclass(frozen=True)
class Who:
    """Who a record says acted: the name then, the id, and what became of the account."""

    name: str
    person_id: int | None  # None: a command acted, or a record older than ids that no account matched
    renamed_to: str = ""  # the account's name now, when it differs from the name then
    removed: bool = False  # the account no longer exists


def who(row: Any) -> Who:
    """``row``'s actor (a HumanDecision or an AuditEntry, its ``user`` selected with it)."""
    if row.user_id is None:
        return Who(row.actor, None)
    try:
        user = row.user
    except ObjectDoesNotExist:  # not selected with the row, and removed since
        user = None
    if user is None:
        return Who(row.actor, row.user_id, removed=True)
    now_named = user.get_username()
    return Who(row.actor, row.user_id, renamed_to="" if now_named == row.actor else now_named)


def reads_as_another(name: str, person_id: int | None) -> bool:
    """Whether the person ``person_id`` (``None``: an account not made yet), named ``name``, would
    read as someone else: another account has the name, or the audit records another person acting
    under it (or someone whose id it does not know), up to capitals ("Carol" reads as "carol"). A
    person may take back a name of their own. A command's name in the audit has a space, which no
    account's name has."""
    from evidence.models import AuditEntry, HumanDecision

    accounts = get_user_model()._default_manager.filter(username__iexact=name)
    if accounts.exclude(pk=person_id).exists() if person_id is not None else accounts.exists():
        return True
    for model in (HumanDecision, AuditEntry):
        acts = model._default_manager.filter(actor__iexact=name)
        if (acts.exclude(user_id=person_id) if person_id is not None else acts).exists():  # null ids too
            return True
    return False


def _audit(action: str, subject: str) -> None:
    from evidence.models import AuditEntry

    person = _acting.get()
    AuditEntry.objects.create(
        run=None, action=action, subject=subject, at=protocol.utc_now(),
        actor=person.get_username() if person is not None else acting_name(), user=person,
    )  # fmt: skip


def remember_name(sender: Any, instance: Any, raw: bool = False, update_fields: Any = None, **kwargs: Any) -> None:
    """Before a person is saved: their name as stored, to see a rename after (one query, skipped
    by saves that cannot rename, such as a login's ``last_login``)."""
    if raw or instance.pk is None or (update_fields is not None and "username" not in update_fields):
        return
    stored = sender._default_manager.filter(pk=instance.pk).values_list("username", flat=True).first()
    instance._audit_name_before = stored


def record_rename(sender: Any, instance: Any, created: bool = False, raw: bool = False, **kwargs: Any) -> None:
    before = instance.__dict__.pop("_audit_name_before", None)
    if raw or created or before is None or before == instance.get_username():
        return
    from evidence.models import AuditEntry

    _audit(AuditEntry.PERSON_RENAMED, f"{label(instance.pk, before)} → {instance.get_username()}")


def record_removal(sender: Any, instance: Any, **kwargs: Any) -> None:
    from evidence.models import AuditEntry

    _audit(AuditEntry.PERSON_REMOVED, label(instance.pk, instance.get_username()))


def connect() -> None:
    user_model = get_user_model()
    pre_save.connect(remember_name, sender=user_model, dispatch_uid="people.remember_name")
    post_save.connect(record_rename, sender=user_model, dispatch_uid="people.record_rename")
    post_delete.connect(record_removal, sender=user_model, dispatch_uid="people.record_removal")
