"""A database's schema as its catalogue has it, in a form two databases can be compared by.

Per table: each column (type, null, default; on SQLite the column's whole definition, with
its inline ``REFERENCES``, ``CHECK`` and ``UNIQUE``), each constraint by name (primary key,
unique, check, foreign key with its deferral) and each index by name (columns, uniqueness,
operator class, condition). Every name counts, the ones Django or the database made up (a
foreign key's, an index on a foreign key, a ``unique=True`` column's) too. Column order does
not. Also the data the roles are made of: each group with its permissions, and which
permissions exist (by content type and codename: Django never renames a permission it made).

``schema_of(url)`` reads another database's, in a child process (tests/subprocess_db.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

# pg_collation's "default": a column without a collation of its own.
DEFAULT_COLLATION = 100


def describe() -> dict[str, Any]:
    """``{"tables": {table: {"columns", "constraints", "indexes"}}, "roles": {group: [permission, ...]},
    "permissions": [app_label.model.codename, ...], "applied": [the receipts migrations recorded]}``."""
    from django.contrib.auth.models import Group, Permission
    from django.db import connection
    from django.db.migrations.recorder import MigrationRecorder

    with connection.cursor() as cursor:
        describe_table = describe_postgresql_table if connection.vendor == "postgresql" else describe_sqlite_table
        tables = {
            table.name: describe_table(cursor, table.name)
            for table in connection.introspection.get_table_list(cursor)
            if table.type == "t"
        }
    roles = {
        group.name: sorted(f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.all())
        for group in Group.objects.prefetch_related("permissions__content_type")
    }
    permissions = Permission.objects.values_list("content_type__app_label", "content_type__model", "codename")
    applied = sorted(name for app, name in MigrationRecorder(connection).applied_migrations() if app == "receipts")
    return {"tables": tables, "roles": roles, "permissions": sorted(".".join(names) for names in permissions),
            "applied": applied}  # fmt: skip


def describe_postgresql_table(cursor: Any, table: str) -> dict[str, Any]:
    cursor.execute(
        """
        SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid),
               a.attidentity, coalesce(co.collname, '')
        FROM pg_attribute a
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> %s
        WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
        """,
        [DEFAULT_COLLATION, table],
    )
    columns = {
        name: {"type": kind, "null": not not_null, "default": default, "identity": identity, "collation": collation}
        for name, kind, not_null, default, identity, collation in cursor.fetchall()
    }
    cursor.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass", [table]
    )
    constraints = dict(cursor.fetchall())
    cursor.execute(
        """
        SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = %s::regclass
        """,
        [table],
    )
    return {"columns": columns, "constraints": constraints, "indexes": dict(cursor.fetchall())}


def describe_sqlite_table(cursor: Any, table: str) -> dict[str, Any]:
    """SQLite keeps a table as the text that made it (``ALTER TABLE`` edits that text): its
    column definitions and named constraints are the schema, read from ``sqlite_master``."""
    cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = %s", [table])
    [create] = cursor.fetchone()
    columns, constraints = {}, {}
    for item in top_level_items(create[create.index("(") + 1 : create.rindex(")")]):
        named = re.fullmatch(r'CONSTRAINT "([^"]+)" (.*)', item, re.DOTALL)
        if named:
            constraints[named[1]] = named[2]
        elif item.startswith('"'):
            name, _, definition = item[1:].partition('" ')
            columns[name] = definition
        else:  # a table constraint without a name: its text is its key
            constraints[item] = item
    # An index SQLite makes for a UNIQUE or PRIMARY KEY has no statement: the table's text above says it.
    cursor.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = %s AND sql IS NOT NULL", [table]
    )
    return {"columns": columns, "constraints": constraints, "indexes": dict(cursor.fetchall())}


def top_level_items(body: str) -> list[str]:
    """The comma-separated items of a ``CREATE TABLE``'s parentheses, commas inside parentheses
    and quotes left alone."""
    items, depth, quote, start = [], 0, "", 0
    for position, character in enumerate(body):
        if quote:
            quote = "" if character == quote else quote
        elif character in "\"'":
            quote = character
        elif character == "(":
            depth += 1
        elif character == ")":
            depth -= 1
        elif character == "," and depth == 0:
            items.append(body[start:position].strip())
            start = position + 1
    return [*items, body[start:].strip()]


def schema_of(url: str, first: str = "") -> dict[str, Any]:
    """``describe`` of the database at ``url``, in one child process that runs the Python
    ``first`` before (a migration, a change)."""
    from tests.subprocess_db import manage

    script = f"{first}\nimport json\nfrom tests.schema import describe\nprint(json.dumps(describe()))"
    return json.loads(manage(url, "shell", "-v", "0", "-c", script, check=True).stdout)
