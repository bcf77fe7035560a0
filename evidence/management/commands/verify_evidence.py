"""``manage.py verify_evidence DIR [--against RUN_DIR]``: exit 0 when the export is intact, else 1."""

from __future__ import annotations

import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandParser

from receipts.reader.verify import verify_export


class Command(BaseCommand):
    help = "Check an export's digests and page (and, with --against, the original run). Needs no database."
    requires_system_checks = ()
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("directory", type=Path)
        parser.add_argument("--against", type=Path, default=None, help="the original run directory")

    def handle(self, *args, directory: Path, against: Path | None, **options) -> None:
        problems = verify_export(directory, against)
        for problem in problems:
            self.stderr.write(problem)
        if problems:
            sys.exit(1)
        self.stdout.write(f"{directory}: intact" + (f", and it matches {against}" if against else ""))
