"""How does a run directory get into the database? Idempotently, incrementally, crash-safely.

``run_import`` takes one run: the ledger is read from where the last import
stopped, in batches, each committed together with the cursor that follows
it; then everything else is read and stored in one transaction. A run whose
files have not changed (same stat fingerprint) and whose stale-age horizon
has not passed is skipped. Rows go in through ``executemany`` with
``ON CONFLICT`` upserts: a second import cannot duplicate anything, and a
killed import leaves committed batches that the next one builds on.
``root_import`` takes every run under a runs root, or those a watch pass chooses.

One import at a time per run: a PostgreSQL advisory lock, or on SQLite a
``flock`` beside the database file.

The parts are the modules beside this one: ``storing`` (the bulk upserts, the
lock, findings opened and closed, the files' rows), ``reading`` (the ledger
batch by batch, children reading ahead), ``crosschecks`` (what the files are
held against), ``rereading`` (what a re-import reads again) and ``watch``
(which runs a pass checks, and what it leaves on them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from evidence.ingest import consequences, provenance
from evidence.ingest.crosschecks import (
    claimed_elsewhere,
    known_receipts,
    ledger_calls,
    pending_decisions,
    reuses_archived_id,
    signing_keys,
)
from evidence.ingest.read_ahead import ReadAheadError
from evidence.ingest.reading import Ahead, Progress, import_ledger, read_here, sweep_calls_folders
from evidence.ingest.rereading import Known, Listing, Scope
from evidence.ingest.storing import (
    close_findings_not_seen,
    judgement,
    open_findings_of,
    refresh_planner_statistics,
    run_import_lock,
    store_call_batches,
    store_files,
    store_findings,
)
from evidence.ingest.watch import ACTIVITY, Watch, stamp_checked
from evidence.lib import hosts, stats
from evidence.models import Call, Event, Finding, Host, Run
from receipts import protocol
from receipts.findings import FILES, FindingRecord, Sentence, storable_text
from receipts.reader import (
    BATCH_EVENTS,
    DEFAULT_LIMITS,
    LedgerCursor,
    Limits,
    RunFiles,
    birth_digest,
    discover_runs,
    read_run_files,
)
from receipts.reader.files import run_signing_key
from receipts.replay import apply_decisions

log = logging.getLogger("callproof.importer")


@dataclasses.dataclass
class RunReport:
    run_id: str
    calls: int
    events: int
    submissions: int
    findings: list[dict[str, str]]
    changed: bool
    failed: bool = False  # the import raised: an import_failed finding says why

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "calls": self.calls,
            "events": self.events,
            "submissions": self.submissions,
            "findings": self.findings,
        }


@dataclasses.dataclass
class ImportReport:
    runs: list[RunReport]
    root_findings: list[dict[str, str]]

    def as_dict(self) -> dict[str, Any]:
        document: dict[str, Any] = {"runs": [run.as_dict() for run in self.runs]}
        if self.root_findings:
            document["root_findings"] = self.root_findings
        return document


# --- entry points ----------------------------------------------------------


def _report(run: Run, changed: bool) -> RunReport:
    summary = stats.RunSummary.of(run)
    return RunReport(
        run_id=run.run_id,
        calls=summary.calls,
        events=run.event_count,
        submissions=summary.submissions,
        findings=open_findings_of(run),
        changed=changed,
    )


def run_import(
    *,
    path: Path,
    limits: Limits = DEFAULT_LIMITS,
    now: dt.datetime | None = None,
    force: bool = False,
    progress: Progress | None = None,
    batch_size: int = BATCH_EVENTS,
    listing: Listing | None = None,
    host: Host | None = None,
) -> RunReport:
    """Import one run directory (its name is the run_id), as ``host``'s (this process's by default).

    ``listing``: the run's fingerprint and receipt signatures, when the caller has
    just taken them (a run root's pass does), so that a hundred thousand files are
    not listed twice. Taken before the lock, it can only be older than the files:
    a change it misses makes the next fingerprint differ.

    Never raises for what is in the directory: a failure nobody foresaw rolls
    back the transaction it happened in, becomes an ``import_failed`` finding on
    the run, and the run is read again on the next import.
    """
    path = Path(path).absolute()
    now = now or protocol.utc_now()
    run_id = path.name
    host = host or hosts.current()
    with run_import_lock(run_id):
        # Who owns the run is decided here, under the run's lock: the first host to import it.
        # The pass's own check (``claimed_elsewhere``) read the owners before taking it, and
        # another host may have created the run since.
        run, _ = Run.objects.select_related("host").get_or_create(
            run_id=run_id, defaults={"path": str(path), "host": host}
        )
        if run.host_id is None:  # imported before hosts were recorded: this host's
            Run.objects.filter(pk=run.pk).update(host=host)
            run.host = host
        elif run.host_id != host.pk:
            raise ClaimedElsewhereError(f"{run.path} on host {run.host}")
        if run.archived:
            raise ClaimedElsewhereError(f"the run archived as {run.archive_path or run.path}")
        try:
            listing = listing or Listing.of(path)
            report = _import_run_locked(run, path, limits, now, force, progress, batch_size, listing)
        except Exception as error:  # noqa: BLE001 - one run's surprise must not stop the others
            detail = Sentence("import_failed.error", error=f"{type(error).__name__}: {error}"[:2000])
            with transaction.atomic():
                store_findings(run, [FindingRecord("import_failed", "import", detail)], now)
                stats.refresh_run_summary(run)
            # Ledger batches committed before the failure stay: each is whole with its cursor.
            run.refresh_from_db()
            report = _report(run, changed=True)
            report.failed = True
            log.error("run import failed", extra={"event": "import_failed", "run_id": run_id, "detail": detail})
            return report
        if report.changed:
            log.info(
                "run imported",
                extra={"event": "run_imported", "run_id": run_id, "events": report.events, "calls": report.calls,
                       "open_findings": len(report.findings)},
            )  # fmt: skip
        return report


class ClaimedElsewhereError(Exception):
    """The run_id is another host's run, or an archived run's: this directory is not imported."""


def _import_run_locked(
    run: Run,
    path: Path,
    limits: Limits,
    now: dt.datetime,
    force: bool,
    progress: Progress | None,
    batch_size: int,
    listing: Listing,
) -> RunReport:
    if not force and Known.of(run).unchanged(path, now, listing):
        return _report(run, changed=False)
    events_before = run.event_count
    decided = pending_decisions(run)
    file_arguments: dict[str, Any] = {
        "limits": limits,
        "now": now,
        "known_contract": run.contract_sha256,
        "listed_signatures": listing.receipt_signatures,
        "keys": signing_keys(),
        "require_signed": settings.EVIDENCE_SIGNED_RUNS_ONLY,
    }
    # The child reads the other files too when this import would read them all, none known:
    # a ledger read from its first byte (so no scope), and no receipt stored to reuse.
    whole_and_new = run.ledger_offset == 0 and (force or not Call.objects.filter(run=run).exists())
    buckets = listing.receipt_buckets()
    calls_read: int | None = None
    # A child reads the ledger's sets of calls into a file (``DiskSet``): kept until the files are
    # read against them, here too when the child that reads them fails.
    with contextlib.ExitStack() as for_the_calls:
        with contextlib.ExitStack() as stack:
            ahead = None
            if settings.EVIDENCE_IMPORT_READ_AHEAD:
                arguments = {"run_dir": path, **file_arguments} if whole_and_new else None
                ahead = Ahead(stack, run, arguments, decided, settings.EVIDENCE_IMPORT_CALLS_BATCH, for_the_calls)
                ahead.start_files(listing.receipt_count)
            cursor, ledger_file_findings, whole_ledger = import_ledger(
                run, path, limits, now, progress, batch_size, ahead
            )
            # Read against the whole ledger, as here; a ledger read only in part (a child that
            # failed halfway) gives a cursor of the new lines only: then the files are read here.
            child = ahead.files_child if ahead is not None and whole_ledger else None
            if child is not None:
                batches = child.files(cursor)

                def store_read_ahead() -> tuple[RunFiles, set]:
                    nonlocal calls_read
                    seen: set = set()

                    def calls() -> Iterator[list[tuple[Any, ...]]]:
                        for rows, findings in batches:
                            seen.update(store_findings(run, findings, now))
                            yield rows

                    calls_read = store_call_batches(run, calls())
                    files = child.files_read
                    store_files(run, files, {}, None, calls=False)
                    return files, seen

                try:  # the calls are stored as they come, in the transaction that stores the rest
                    _store_run(run, path, now, listing, buckets, ledger_file_findings, None, store_read_ahead)
                except ReadAheadError as failure:  # rolled back: read here
                    read_here(run.run_id, failure)
                    calls_read = None
        if calls_read is None:
            calls_read = _read_and_store(
                run,
                path,
                now,
                force,
                listing,
                buckets,
                cursor,
                whole_ledger,
                ledger_file_findings,
                decided,
                file_arguments,
            )
    refresh_planner_statistics({Event: run.event_count - events_before, Call: calls_read})
    if run.bodies_stripped_at is not None:
        # Retention stripped this run's bodies: what was read again is stripped again.
        from evidence.retention.actions import strip_bodies

        strip_bodies(run=run, now=now)
    return _report(run, changed=True)


def _read_and_store(
    run: Run,
    path: Path,
    now: dt.datetime,
    force: bool,
    listing: Listing,
    buckets: dict[str, str],
    cursor: LedgerCursor,
    whole_ledger: bool,
    ledger_file_findings: list[FindingRecord],
    decided: dict[str, tuple[str, str]],
    file_arguments: dict[str, Any],
) -> int:
    """Read the run's other files in this process (those that may have changed, unless
    ``force`` or the ledger was read whole) and store them; how many receipts were read."""
    scope = None if force or whole_ledger else Scope.of(run, listing, buckets, cursor.call_ids, decided)
    while True:
        if not whole_ledger:  # the sets name the new lines' calls only: those of the stored ledger
            ledger_calls(run, cursor, None if scope is None else scope.calls)
        known = {} if force else known_receipts(run, None if scope is None else scope.calls)
        files = read_run_files(
            path, ledger=cursor, known_receipts=known, receipt_names=None if scope is None else scope.receipt_names,
            **file_arguments,
        )  # fmt: skip
        if not files.contract_changed:
            break
        scope = None  # every receipt's identity depends on the contract: all of them, again
    # Before the decisions: a reused record is the known one, which they change.
    judged_before = {call_id: judgement(record) for call_id, record in known.items()}
    apply_decisions(files, decided=decided)
    among = None if scope is None else scope.calls

    def store() -> tuple[RunFiles, set]:
        store_files(run, files, judged_before, among)
        return files, set()

    _store_run(
        run, path, now, listing, buckets, ledger_file_findings, None if scope is None else scope.rechecked, store
    )
    return len(files.calls) - len(files.reused_calls)


def _store_run(
    run: Run,
    path: Path,
    now: dt.datetime,
    listing: Listing,
    buckets: dict[str, str],
    ledger_file_findings: list[FindingRecord],
    rechecked: Callable[[str, str], bool] | None,
    store: Callable[[], tuple[RunFiles, set]],
) -> None:
    """In one transaction: the other files (``store`` stores them, and returns what was read
    and the keys of the findings it stored meanwhile), their findings (those not seen again
    closed, of those ``rechecked``), and the run's row."""
    with transaction.atomic():
        files, seen = store()
        # Which confirmations no decision made here matches: the host's word, said once each.
        provenance.judge(run, now, lambda: run_signing_key(path, signing_keys()) is not None)
        # What each decided call's target shows, held against the decision the runtime followed.
        consequences.check(run, path, now)
        seen |= store_findings(run, ledger_file_findings + files.findings, now)
        # Ledger findings were stored batch by batch; re-check only what this pass re-checked.
        close_findings_not_seen(run.findings.filter(scope=FILES), seen, now, rechecked)
        Run.objects.filter(pk=run.pk).update(
            path=str(path),
            state=files.state,
            finished=protocol.run_is_finished(files.state),
            attempts=files.attempts,
            contract_sha256=files.contract_sha256,
            steer_sha256=birth_digest(path),
            fingerprint=listing.fingerprint,
            receipt_buckets=buckets,
            next_stale_at=files.next_stale_at,
            event_count=sum(run.event_type_counts.values()),  # counted batch by batch
            imported_at=now,
        )
        stats.refresh_run_summary(run)
    run.refresh_from_db()


def root_import(
    *,
    root: Path,
    limits: Limits = DEFAULT_LIMITS,
    now: dt.datetime | None = None,
    force: bool = False,
    progress: Progress | None = None,
    report_unchanged: bool = True,
    host: Host | None = None,
    watch: Watch | None = None,
    leave: Collection[str] = (),
) -> ImportReport:
    """Import every run directory under ``root`` (or ``root`` itself when it is one), as
    ``host``'s (this process's by default): a run another host imported is not imported here.
    The runs named in ``leave`` are left for a later pass (a shipped run still arriving).

    One bad run never stops the others: its problems are findings on it. What the
    last import recorded of every run is read in one query, so a run whose files
    have not changed costs its ``stat`` calls and nothing else; without
    ``report_unchanged`` (the watch) it is not even reported.

    With ``watch`` only the runs ``Watch.to_check`` chooses are checked (and reported): the
    hot set, the cold runs due, and new directories; the others cost one entry of the root's
    listing. Every run checked is stamped checked (and changed, when its files were), and is
    found abandoned, or no longer, by ``models.is_abandoned``.
    """
    now = now or protocol.utc_now()
    host = host or hosts.current()
    sweep_calls_folders()  # a killed importer's, before this pass makes its own
    discovery = discover_runs(Path(root))
    root_key = storable_text(str(Path(root).absolute()))
    base, names = discovery.base.absolute(), [name for name in discovery.names if name not in leave]
    if watch is not None:
        chosen = watch.to_check(base, names, host, now)
        names = [name for name in names if name in chosen]
    fields = ("run_id", "path", "fingerprint", "next_stale_at", "archived", "summary", "host__name", "steer_sha256",
              "archived_at", *ACTIVITY)  # fmt: skip
    rows = [
        row
        for start in range(0, len(names), 500)
        for row in Run.objects.filter(run_id__in=names[start : start + 500]).values_list(*fields)
    ]
    known = {row[0]: Known(row[1], row[2], row[3], row[4], row[5] is not None) for row in rows}
    owners = {row[0]: row[6] for row in rows}
    births = {row[0]: (row[7], row[8]) for row in rows}
    activity = {row[0]: row[9:] for row in rows}
    changed: list[tuple[Path, Listing | None]] = []
    unchanged: list[str] = []
    root_problems = list(discovery.findings)
    for path in (base / name for name in names):
        recorded = known.get(path.name)
        if recorded is not None and recorded.archived:
            # An archived run is never brought back; retention removes what is left of it. A
            # directory holding another run under its id is said, and nothing removes it.
            reused = reuses_archived_id(path, *births[path.name])
            if reused:
                root_problems.append(FindingRecord("archived_run_id_reused", path.name, reused))
            continue
        other = claimed_elsewhere(path, recorded.path if recorded else None, owners.get(path.name), host)
        if other is not None:
            detail = Sentence("duplicate_run_id.elsewhere", run_id=path.name, other=other)
            root_problems.append(FindingRecord("duplicate_run_id", path.name, detail))
        elif force or recorded is None or not recorded.may_be_unchanged(path, now):
            changed.append((path, None))
        elif watch is not None and watch.unchanged_at_a_glance(path, recorded, now):
            unchanged.append(path.name)
        elif recorded.unchanged(path, now, listing := _listing(path, recorded, watch, now)):
            unchanged.append(path.name)
            if watch is not None:
                watch.keep(path, listing, now)
        else:
            changed.append((path, listing))
    reports = []
    for path, listed in changed:
        try:
            report = run_import(path=path, limits=limits, now=now, force=force, progress=progress,
                                listing=listed, host=host)  # fmt: skip
        except ClaimedElsewhereError as claimed:
            detail = Sentence("duplicate_run_id.elsewhere", run_id=path.name, other=claimed)
            root_problems.append(FindingRecord("duplicate_run_id", path.name, detail))
            continue
        reports.append(report)
        if watch is not None and listed is not None and not report.failed:
            watch.keep(path, listed, now)  # the fingerprint the import stored
    with transaction.atomic():  # after the imports: some are found under the runs' own locks
        seen = store_findings(None, root_problems, now, root=root_key)
        close_findings_not_seen(Finding.objects.filter(run__isnull=True, root=root_key), seen, now)
    imported = [report.run_id for report in reports]
    failed = {report.run_id for report in reports if report.failed}
    stamp_checked(imported, failed, unchanged, known, activity, now)
    if report_unchanged:
        reports += [_report(run, changed=False) for run in Run.objects.filter(run_id__in=unchanged)]
        reports.sort(key=lambda report: report.run_id)
    root_findings = [
        {"code": f.code, "subject": f.subject, "detail": f.detail}
        for f in Finding.objects.filter(run__isnull=True, root=root_key, closed_at__isnull=True)
    ]
    return ImportReport(reports, root_findings)


def _listing(path: Path, recorded: Known, watch: Watch | None, now: dt.datetime) -> Listing:
    """A run's listing for a pass: a watch lists it again by names and inodes when it can."""
    if watch is None:
        return Listing.of(path)
    return watch.listed_again(path, recorded, now) or Listing.of(path, glance=True)
