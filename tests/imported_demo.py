"""The demo runs imported for real once in a while, and their rows put back for each test that asks.

355 tests start from the demo runs imported (the ``demo`` fixture). A real import of the nine runs
is 0.4-0.5 s on PostgreSQL and 0.2-0.3 s on SQLite, most of it Django building some 380 queries:
a quarter of an hour of the two passes' worker time. Here a test process imports them for real,
keeps the rows that import made, and for the next test that asks inserts the same rows again, with
their own primary keys, into that test's database (one query a table), then moves the sequences
past them. It imports for real again, into a new copy of the runs, when

- a test changed the copy (a settlement written into a run, a file edited, a run moved away): the
  files' stamp (names, sizes, times, inodes) is no longer the one the rows were read from;
- the rows are more than ``MAX_AGE_SECONDS`` old: an import's times (when it ran, when each call
  turns stale, when its host was seen) drift no further from the clock than a slow test's own;
- the test's database already holds a row with one of the same primary keys.

Every test so gets what a real import of an untouched copy would give it, the run directory's
files included: the same ``Run.path`` and file signatures, so that importing again reads nothing.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from django.apps import apps
from django.core.management.color import no_style
from django.db import connection
from django.db.models import Model

from tests.helpers import import_as_seen_later

MAX_AGE_SECONDS = 60.0

Rows = dict[type[Model], list[dict[str, Any]]]


def tree_stamp(root: Path) -> list[tuple[str, int, int, int, int, int]]:
    """Every name under ``root`` with its mode, size, times and inode: any change moves one."""
    stamp = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in (folder, *(os.path.join(folder, entry) for entry in sorted(files))):
            facts = os.lstat(name)
            stamp.append((name, facts.st_mode, facts.st_size, facts.st_mtime_ns, facts.st_ctime_ns, facts.st_ino))
    return stamp


def every_model() -> list[type[Model]]:
    return [model for model in apps.get_models(include_auto_created=True) if model._meta.managed]


class ImportedDemo:
    """One test process's demo runs: a copy under ``folder`` and the rows its real import made."""

    def __init__(self, source: Path, folder: Path) -> None:
        self.source, self.folder = source, folder
        self.copies = 0
        self.root: Path | None = None
        self.rows: Rows = {}
        self.stamp: list[tuple[str, int, int, int, int, int]] = []
        self.imported_at = 0.0

    def for_this_test(self) -> Path:
        """The demo runs, imported into this test's database; their folder."""
        if self.root is not None and self._still_true() and self._put_back():
            return self.root
        return self._import()

    def _still_true(self) -> bool:
        assert self.root is not None
        return time.monotonic() - self.imported_at < MAX_AGE_SECONDS and tree_stamp(self.root) == self.stamp

    def _import(self) -> Path:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        self.copies += 1
        self.root = Path(shutil.copytree(self.source, self.folder / f"runs-{self.copies}", symlinks=True))
        before = {model: set(model._base_manager.values_list("pk", flat=True)) for model in every_model()}
        import_as_seen_later(self.root)
        self.imported_at = time.monotonic()
        self.rows = {}
        for model in every_model():
            fields = [field.attname for field in model._meta.concrete_fields]
            made = model._base_manager.exclude(pk__in=before[model]).order_by("pk").values(*fields)
            if made:
                self.rows[model] = list(made)
        self.stamp = tree_stamp(self.root)
        return self.root

    def _put_back(self) -> bool:
        """The rows again, as the import made them; False when one of their keys is taken."""
        for model, rows in self.rows.items():
            if model._base_manager.filter(pk__in=[row[model._meta.pk.attname] for row in rows]).exists():
                return False
        for model, rows in self.rows.items():
            model._base_manager.bulk_create([model(**row) for row in rows])
        # Rows inserted with their keys leave PostgreSQL's sequences behind them: the next row a
        # test makes would take a key already used.
        with connection.cursor() as cursor:
            for statement in connection.ops.sequence_reset_sql(no_style(), list(self.rows)):
                cursor.execute(statement)
        return True
