"""``manage.py enqueue_maintenance NAME...``: queue maintenance for the worker (a timer starts this)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from evidence.maintenance import MAINTENANCE


class Command(BaseCommand):
    help = (
        "Queue maintenance tasks for the worker (manage.py db_worker) to run: "
        f"{', '.join(MAINTENANCE)}, or all. Returns at once; the worker does the work."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="+", metavar="NAME", help=f"{', '.join(MAINTENANCE)} or all")

    def handle(self, *args, names: list[str], **options) -> None:
        unknown = [name for name in names if name != "all" and name not in MAINTENANCE]
        if unknown:
            raise CommandError(
                f"no maintenance task {', '.join(map(repr, unknown))}: one of {', '.join(MAINTENANCE)}, all"
            )
        chosen = list(MAINTENANCE) if "all" in names else list(dict.fromkeys(names))
        for name in chosen:
            result = MAINTENANCE[name].enqueue()
            self.stdout.write(f"{name}: queued as {result.id}")
