"""The squashed migrations (evidence/migrations) make the database the long way made.

Before the first release the dashboard's 37 migrations became one ``0001_initial`` and the data
migration of the roles (issue 40). The old ones are kept in tests/data/migrations_long for this
module alone: one new database is migrated through them, another through the squashed ones as far
as the squash, and the two are compared as their catalogues describe them (tests/schema.py), on
the database the suite runs on.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import psycopg
import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection

from evidence.lib.roles import ROLES
from tests.schema import schema_of
from tests.subprocess_db import this_database_url

pytestmark = pytest.mark.django_db

LONG_WAY = "tests.data.migrations_long"
# Where the squash ends: a migration added after it has no twin on the long way.
SQUASHED_AT = "0002_roles"

MIGRATE_THE_LONG_WAY = f"""
from django.conf import settings
from django.core.management import call_command
settings.MIGRATION_MODULES = {{"receipts": {LONG_WAY!r}}}
call_command("migrate", verbosity=0)
"""
MIGRATE = """
from django.core.management import call_command
call_command("migrate", verbosity=0)
"""
MIGRATE_AS_FAR_AS_THE_SQUASH = f"""
from django.core.management import call_command
from django.db.migrations.loader import MigrationLoader
call_command("migrate", "receipts", {SQUASHED_AT!r}, verbosity=0)
for label in sorted(MigrationLoader(None, ignore_no_migrations=True).migrated_apps - {{"receipts"}}):
    call_command("migrate", label, verbosity=0)
"""
# One change of each kind the comparison reads, made as a migration would make it.
CHANGE_ONE_OF_EACH = """
from django.db import connection, models
from evidence.models import Finding, Host, HumanDecision, Run

def changed(model, name, **options):
    field = model._meta.get_field(name).clone()
    if field.remote_field:  # a clone names its target; the schema editor reads the model
        field.remote_field.model = model._meta.get_field(name).remote_field.model
    for option, value in options.items():
        setattr(field, option, value)
    field.set_attributes_from_name(name)
    field.model = model
    return field

with connection.schema_editor() as editor:
    editor.alter_field(Run, Run._meta.get_field("path"), changed(Run, "path", null=True))
    editor.alter_field(Host, Host._meta.get_field("name"), changed(Host, "name", max_length=129))
    editor.alter_field(Finding, Finding._meta.get_field("triage"), changed(Finding, "triage", db_default="none"))
    run = HumanDecision._meta.get_field("run")
    editor.alter_field(HumanDecision, run, changed(HumanDecision, "run", db_constraint=False))
    [pending] = [index for index in HumanDecision._meta.indexes if index.name == "decision_pending_idx"]
    editor.remove_index(HumanDecision, pending)
    editor.add_index(HumanDecision, models.Index(fields=["run"], condition=models.Q(delivered_at=None),
                                                 name="decision_pending_idx"))
"""  # fmt: skip


@pytest.fixture(scope="module")
def new_database(django_db_setup, tmp_path_factory) -> Iterator[Callable[..., str]]:
    """Makes a database of the kind the suite runs on, beside the suite's own: ``(name, copy_of=None)``
    gives the URL of an empty one, or of a copy of the one at ``copy_of``. PostgreSQL's are
    named after the suite's test database (one per pytest-xdist worker) and dropped at the end."""
    if connection.vendor != "postgresql":
        folder = tmp_path_factory.mktemp("databases")

        def sqlite_file(name: str, copy_of: str | None = None) -> str:
            path = folder / f"{name}.sqlite3"
            if copy_of is not None:
                shutil.copyfile(copy_of.removeprefix("sqlite:///"), path)
            return f"sqlite:///{path}"

        yield sqlite_file
        return
    server, suite_database = this_database_url().rsplit("/", 1)
    made: list[str] = []
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:

        def postgresql_database(name: str, copy_of: str | None = None) -> str:
            database = f"{suite_database}_{name}"
            template = f" TEMPLATE {copy_of.rsplit('/', 1)[1]}" if copy_of is not None else ""
            admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")  # a killed run's
            admin.execute(f"CREATE DATABASE {database}{template}")
            made.append(database)
            return f"{server}/{database}"

        yield postgresql_database
        for database in made:
            admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


@pytest.fixture(scope="module")
def migrated(new_database) -> dict[str, Any]:
    """The schemas of a database migrated the long way and of one migrated as far as the squash,
    and their URLs."""
    long_way, squashed, fresh = new_database("long_way"), new_database("squashed"), new_database("fresh")
    return {"long_way": schema_of(long_way, first=MIGRATE_THE_LONG_WAY), "long_way_url": long_way,
            "squashed": schema_of(squashed, first=MIGRATE_AS_FAR_AS_THE_SQUASH), "squashed_url": squashed,
            "fresh": schema_of(fresh, first=MIGRATE), "fresh_url": fresh}  # fmt: skip


def differences(tables: dict[str, Any], others: dict[str, Any]) -> set[tuple[str, ...]]:
    """Where two schemas differ: a table one lacks, or a table's column, constraint or index
    (by name) that one lacks or defines otherwise."""
    found: set[tuple[str, ...]] = {(table,) for table in tables.keys() ^ others.keys()}
    for table in tables.keys() & others.keys():
        for part in ("columns", "constraints", "indexes"):
            mine, theirs = tables[table][part], others[table][part]
            found |= {(table, part, name) for name in mine.keys() | theirs.keys() if mine.get(name) != theirs.get(name)}
    return found


def after_the_squash() -> list[Any]:
    """The dashboard's migrations made after the squash: they have no twin on the long way."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, ignore_no_migrations=True)
    return sorted(
        (
            migration
            for (app, name), migration in loader.disk_migrations.items()
            if app == "receipts" and name > SQUASHED_AT
        ),
        key=lambda migration: migration.name,
    )


def tables_made_after_the_squash() -> set[str]:
    from django.db.migrations.operations import CreateModel

    return {
        apps.get_model("receipts", operation.name)._meta.db_table
        for migration in after_the_squash()
        for operation in migration.operations
        if isinstance(operation, CreateModel)
    }


def test_the_squashed_migrations_make_the_tables_the_long_way_made(migrated):
    assert len(migrated["long_way"]["applied"]) == 37, "every file of the long way ran"
    assert migrated["squashed"]["applied"] == ["0001_initial", SQUASHED_AT]
    long_way, squashed = migrated["long_way"]["tables"], migrated["squashed"]["tables"]
    made_since = tables_made_after_the_squash()
    assert {model._meta.db_table for model in apps.get_models()} - made_since <= long_way.keys()
    assert differences(long_way, squashed) == set()
    assert squashed == long_way


def test_the_squashed_migrations_make_the_roles_the_long_way_made(migrated):
    long_way, squashed = migrated["long_way"], migrated["squashed"]
    assert squashed["roles"] == {role: sorted(permissions) for role, permissions in ROLES.items()}
    assert long_way["roles"] == squashed["roles"]
    assert long_way["permissions"] == squashed["permissions"]


def test_a_database_at_the_end_of_the_long_way_takes_the_squashed_migrations_as_it_is(migrated, new_database):
    """A development database made before the squash: Django finds ``0001_initial`` applied (the
    long way's was recorded under that name) and applies ``0002_roles``, which finds the roles made."""
    upgraded = new_database("upgraded", copy_of=migrated["long_way_url"])
    after = schema_of(upgraded, first=MIGRATE)
    since = {migration.name for migration in after_the_squash()}
    assert set(after["applied"]) == {*migrated["long_way"]["applied"], "0002_roles", *since}
    # Migrated to the end, it is what a new database migrated to the end is.
    assert differences(migrated["fresh"]["tables"], after["tables"]) == set()
    assert after["roles"] == migrated["squashed"]["roles"]


def test_a_database_stopped_part_of_the_way_is_refused_with_what_to_do(new_database):
    """Stopped at 0021 of the long way: Django would take the squashed 0001_initial as applied and
    leave the tables short of columns; the roles' migration refuses, naming the way out."""
    from tests.subprocess_db import manage

    stopped = new_database("stopped")
    script = MIGRATE_THE_LONG_WAY.replace('call_command("migrate", verbosity=0)',
                                          'call_command("migrate", "receipts", "0021", verbosity=0)')  # fmt: skip
    manage(stopped, "shell", "-v", "0", "-c", script, check=True)
    refused = manage(stopped, "migrate", "-v", "0", check=False)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert (
        "migrated part of the way by an earlier Callproof (its last dashboard migration: 0021_hosts_and_delivery)"
        in (refused.stderr)
    )
    assert "0039_finding_values" in refused.stderr


def test_the_comparison_sees_a_change_of_each_kind(migrated, new_database):
    """A type, a null, a default, a foreign key and an index's condition: each shows."""
    changed = new_database("changed", copy_of=migrated["fresh_url"])
    before, after = migrated["fresh"]["tables"], schema_of(changed, first=CHANGE_ONE_OF_EACH)["tables"]
    decisions = "receipts_humandecision"
    if connection.vendor == "postgresql":
        [foreign_key] = [name for name, definition in before[decisions]["constraints"].items()
                         if definition.startswith("FOREIGN KEY (run_id)")]  # fmt: skip
        dropped = (decisions, "constraints", foreign_key)
    else:  # SQLite keeps a foreign key in its column's definition
        dropped = (decisions, "columns", "run_id")
    assert differences(before, after) == {
        ("receipts_run", "columns", "path"),
        ("receipts_host", "columns", "name"),
        ("receipts_finding", "columns", "triage"),
        dropped,
        (decisions, "indexes", "decision_pending_idx"),
    }


def test_no_model_change_lacks_its_migration():
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()
