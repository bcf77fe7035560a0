"""``manage.py import_runs ROOT [--json] [--watch]``: run directories into the database.

On an agent host, pointed at the central database, ``--watch`` is the host's
shipper: it registers the host, delivers the people's decisions about its runs
before each pass, beats the host's heart after each, and applies retention to
its own runs every ``EVIDENCE_WATCH_RETENTION_SECONDS`` (only a run's own host
touches its files).

A one-off import checks every run. A watch checks the hot set (``RunQuerySet.hot``), the
cold runs due for their sweep (``EVIDENCE_COLD_SWEEP_SECONDS``) and new run directories,
from its first pass on (``--force`` makes the first pass a full, forced one). Between passes
it waits for a write in the root or in a run it checked (inotify, ``lib/inotify.py``), at most
``--interval`` seconds.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import signal
import sys
import threading
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import Error as DatabaseFailure
from django.db import close_old_connections, connections

from evidence.ingest import delivery
from evidence.ingest.importer import ImportReport, root_import
from evidence.ingest.watch import Watch
from evidence.lib import hosts, stopping
from evidence.lib.inotify import Waker
from evidence.retention import actions
from evidence.review import alerts
from receipts import protocol
from receipts.reader import MAX_JSON_BYTES, MAX_LINE_BYTES, Limits


class ProgressBar:
    """A one-line bar on a terminal's standard error; silent when it is not a terminal."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.enabled = stream.isatty()
        self.last_draw = 0.0

    def __call__(self, run_id: str, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.last_draw < 0.1 and done < total):
            return
        self.last_draw = now
        fraction = min(1.0, done / total) if total else 1.0
        filled = int(fraction * 30)
        self.stream.write(f"\r{run_id[:30]:<30} [{'#' * filled}{'.' * (30 - filled)}] {fraction:6.1%} ")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


class Command(BaseCommand):
    help = "Import every run directory under ROOT (or ROOT itself when it is one). Safe to run again and at once."
    # The system checks take longer than importing an unchanged run; `manage.py check` and
    # `migrate` make them, and a watcher that runs for days gains nothing from them.
    requires_system_checks = ()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "root", type=Path, nargs="?", default=None, help="runs root or run directory (default: EVIDENCE_RUNS_ROOT)"
        )
        parser.add_argument("--json", action="store_true", help="print the report as one JSON document")
        parser.add_argument(
            "--watch", action="store_true", help="re-import changes until interrupted, checking the hot set each pass"
        )
        parser.add_argument("--interval", type=float, default=3.0, help="seconds between --watch passes (3)")
        parser.add_argument("--force", action="store_true", help="re-read runs whose files did not change")
        parser.add_argument("--stale-minutes", type=float, default=15.0, help="stale age of reservations and calls")
        parser.add_argument("--max-file-mib", type=float, default=MAX_JSON_BYTES / 2**20)
        parser.add_argument("--max-line-mib", type=float, default=MAX_LINE_BYTES / 2**20)

    def handle(self, *args, root: Path | None, **options) -> None:
        root = root or Path(settings.EVIDENCE_RUNS_ROOT)
        if not root.exists():
            raise CommandError(f"{root} does not exist")
        if options["interval"] <= 0 or options["stale_minutes"] <= 0:
            raise CommandError("--interval and --stale-minutes must be positive")
        limits = Limits(
            max_json_bytes=int(options["max_file_mib"] * 2**20),
            max_line_bytes=int(options["max_line_mib"] * 2**20),
            stale_after=dt.timedelta(minutes=options["stale_minutes"]),
        )
        progress = ProgressBar(sys.stderr)
        try:
            host = hosts.register(runs_root=root, watching=options["watch"])
        except hosts.HostTakenError as taken:
            raise CommandError(str(taken)) from None
        if not options["watch"]:
            started = time.monotonic()
            self.deliver(host)
            report = root_import(root=root, limits=limits, force=options["force"], progress=progress, host=host)
            hosts.beat(host, pass_seconds=time.monotonic() - started)
            self.tell(report)
            self.emit(report, options["json"], only_changed=False)
            return
        watch = Watch.from_settings()
        # systemd (and a shell that ignores SIGINT, as a non-interactive one does) stops a watch
        # with SIGTERM: end as Ctrl-C does, between or inside a pass (its transaction rolls back).
        previous = signal.signal(signal.SIGTERM, stopping.raise_interrupt)
        first_pass = True  # until one pass has gone through: --force applies, and it reports every run
        retention_every = settings.EVIDENCE_WATCH_RETENTION_SECONDS
        retention_due = time.monotonic()  # after the first pass that goes through
        waker = Waker()
        try:
            while True:
                started = time.monotonic()
                # A connection PostgreSQL ended since the last pass is found here (conn_health_checks)
                # and opened again, instead of failing every pass on "the connection is closed".
                close_old_connections()
                try:
                    hosts.check_lease(host)  # never deliver into this root for a host another holds
                    self.deliver(host)
                    waker.drain()  # what was written so far, the pass below sees (the decisions too)
                    with delivery.BesideThePass(host, say=self.stderr.write):
                        report = root_import(
                            root=root, limits=limits, progress=progress, host=host,
                            force=first_pass and options["force"], report_unchanged=first_pass,
                            watch=None if first_pass and options["force"] else watch,
                        )  # fmt: skip
                    hosts.beat(host, pass_seconds=time.monotonic() - started)
                    self.tell(report)
                    if retention_every and time.monotonic() >= retention_due:
                        self.apply_retention(host)
                        retention_due = time.monotonic() + retention_every
                except DatabaseFailure as error:
                    if stopping.interrupted(error):  # a stop cut a query short: its rollback failed after
                        raise KeyboardInterrupt from error
                    # The database went away (a restart, a full disk, an ended connection), in the
                    # first pass or any other: the watch goes on with a new connection and tries again.
                    self.stderr.write(f"import pass failed, trying again in {options['interval']} s: {error}")
                    connections.close_all()
                    with contextlib.suppress(DatabaseFailure):  # said on the Hosts page and /metrics
                        hosts.record_error(host, f"{type(error).__name__}: {error}")
                else:
                    self.emit(report, options["json"], only_changed=not first_pass)
                    first_pass = False
                    # Woken by a write in the root, in a run this pass checked or in an abandoned
                    # one (the writer ends each command with a ledger line), or after the interval:
                    # a change in another run waits for the pass that checks it, as it would have.
                    # A run followed only from now on (a new one) may have been written since the
                    # pass read it, with nobody to wake: the next pass comes at once.
                    if not waker.follow([root.absolute(), *watch.following]):
                        waker.wait(options["interval"])
                    continue
                time.sleep(options["interval"])  # the database away: not sooner, whatever is written
        except hosts.LeaseLostError as lost:
            raise CommandError(str(lost)) from None
        except KeyboardInterrupt:
            self.stderr.write("stopped watching")
            _say_stopped(host)
        finally:
            waker.close()
            signal.signal(signal.SIGTERM, previous)

    def deliver(self, host) -> None:
        """The people's decisions about this host's runs, into their directories first: the pass
        that follows imports what the writer wrote."""
        report = delivery.deliver_pending(host=host)
        if report.delivered or report.refused or report.failed:
            self.stderr.write(
                f"decisions: {report.delivered} delivered, {report.refused} refused, {report.failed} to try again"
            )

    def tell(self, report: ImportReport) -> None:
        """A pass that changed a run may have put a call in doubt: the worker tells the rules'
        destinations (``alerts.queue``: one task waiting at a time, none without a rule)."""
        if any(run.changed for run in report.runs):
            alerts.queue()

    def apply_retention(self, host) -> None:
        """What is due of this host's runs (``actions.apply_due``, as ``apply_retention --apply``)."""
        results = actions.apply_due(now=protocol.utc_now(), apply=True, host=host, due_only=True)
        done = [result for result in results if result.get("applied") not in (None, "nothing")]
        for result in done:
            said = result.get("error") or result.get("archive") or ""
            self.stderr.write(f"retention: {result['run_id']} {result['applied']}{'; ' + str(said) if said else ''}")

    def emit(self, report: ImportReport, as_json: bool, *, only_changed: bool) -> None:
        if only_changed:
            report.runs = [run for run in report.runs if run.changed]
            if not report.runs:
                return
        if as_json:
            self.stdout.write(json.dumps(report.as_dict(), ensure_ascii=False))
            return
        for run in report.runs:
            codes = sorted({finding["code"] for finding in run.findings})
            state = (
                "import failed (see its import_failed finding)"
                if run.failed
                else "imported"
                if run.changed
                else "unchanged"
            )
            self.stdout.write(
                f"{run.run_id}: {state}; {run.calls} calls, {run.events} events, {run.submissions} submissions, "
                f"{len(run.findings)} open findings{' (' + ', '.join(codes) + ')' if codes else ''}"
            )
        for finding in report.root_findings:
            self.stdout.write(f"runs root: {finding['code']} {finding['subject']}: {finding['detail']}")


def _say_stopped(host) -> None:
    """The host's stop, on a connection of its own: the interrupt may have landed inside a query or
    a transaction's end, leaving this thread's connection unusable or still inside its block
    (a stop written there was never committed)."""

    def say() -> None:
        try:
            with contextlib.suppress(DatabaseFailure):
                hosts.stopped(host)
        finally:
            connections.close_all()  # this thread's own

    teller = threading.Thread(target=say, name="say-stopped")
    teller.start()
    teller.join(timeout=30)
