"""``manage.py import_mirrors [--watch] [--interval S]``: import what agent hosts shipped.

Each host's folder of the mirror (``EVIDENCE_MIRROR_ROOT/<host>``, written by the shipper's
requests, ``evidence.ingest.shipping``) is imported as that host's, by the importer every run goes
through: a run belongs to the first host that ships it (decided under the run's lock).
"""

from __future__ import annotations

import signal
import time

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import Error as DatabaseFailure
from django.db import close_old_connections, connections

from evidence.ingest import mirror
from evidence.ingest.importer import root_import
from evidence.ingest.watch import Watch
from evidence.lib import stopping
from evidence.models import Host


class Command(BaseCommand):
    help = "Import the runs agent hosts shipped (callproof ship) from EVIDENCE_MIRROR_ROOT, each as its host's."
    requires_system_checks = ()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--watch", action="store_true", help="import again what changes until interrupted")
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between --watch passes (1)")

    def handle(self, *args, **options) -> None:
        if options["interval"] <= 0:
            raise CommandError("--interval must be positive")
        if not options["watch"]:
            self.import_all(watch=None)
            return
        watch = Watch.from_settings()
        previous = signal.signal(signal.SIGTERM, stopping.raise_interrupt)
        try:
            while True:
                close_old_connections()
                try:
                    self.import_all(watch=watch)
                except DatabaseFailure as error:
                    if stopping.interrupted(error):  # a stop cut a query short: its rollback failed after
                        raise KeyboardInterrupt from error
                    self.stderr.write(f"import pass failed, trying again: {error}")
                    connections.close_all()
                time.sleep(options["interval"])
        except KeyboardInterrupt:
            self.stderr.write("stopped watching")
        finally:
            signal.signal(signal.SIGTERM, previous)

    def import_all(self, *, watch: Watch | None) -> None:
        mirror.sweep_parts()
        for host in Host.objects.filter(keys__isnull=False).distinct():
            root = mirror.mirror_root(host)
            if root.is_dir():
                # A run whose shipper is between two pushes of a pass waits for the last: never
                # read half arrived (a receipt whose ledger line is still on its way).
                arriving = mirror.arriving(host)
                report = root_import(root=root, host=host, watch=watch, report_unchanged=False, leave=arriving)
                for run in report.runs:
                    if run.changed:
                        self.stdout.write(f"{host.name}/{run.run_id}: imported; {run.events} events")
