"""Evidence exports people ask for on a run's page: queued in a request, made by the worker.

The request only writes an ``Export`` row and queues ``make_export``; the worker writes
the zip (evidence/export/bundle.py, telling the row how far it is) under ``EVIDENCE_EXPORT_ROOT``, as a
temp file renamed into place once whole, so a failed export leaves no file; the maintenance
task removes what finished more than ``EVIDENCE_EXPORT_KEEP_HOURS`` ago.

A running export holds a lease: the worker beats ``heartbeat_at`` from a thread while it makes
it. One whose heartbeat is older than ``EVIDENCE_EXPORT_LEASE_SECONDS`` lost its worker (killed,
restarted: django-tasks never reclaims a running task): the page shows it failed at once, and
the maintenance task marks it so, never "running" for ever.

What one person may ask for is bounded (``ExportRefused``): one export of a run in flight at a
time, ``EVIDENCE_EXPORTS_PER_HOUR`` exports an hour, and none while the export root holds
``EVIDENCE_EXPORT_DISK_BUDGET_BYTES``. The person's own row is locked while the rules are read and
the export written, so two requests at the same moment cannot both pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import errno
import json
import logging
import os
import tempfile
import threading
import zipfile
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction
from django.db.models import BooleanField, Case, DateTimeField, ExpressionWrapper, Q, Value, When
from django.db.models.functions import Now
from django.utils import translation
from django_tasks import task

from evidence.export.bundle import export_run
from evidence.export.redaction import Policy, file_name
from evidence.models import Export, Run
from receipts import durable, protocol

log = logging.getLogger("callproof.export")

SHOWN_ON_THE_PAGE = 5  # the run page lists this many of its newest exports


RATE_WINDOW = dt.timedelta(hours=1)  # EVIDENCE_EXPORTS_PER_HOUR counts the exports asked for in this


@dataclasses.dataclass
class ExportRefused(Exception):  # noqa: N818 - a verdict, said to the person who asked
    """Why an export was not queued, as data: the page words it (receipts/_export_refused.html)."""

    IN_FLIGHT, RATE, DISK = "in_flight", "rate", "disk"

    reason: str
    in_flight: Export | None = None  # IN_FLIGHT: the person's export of this run still to finish
    next_at: dt.datetime | None = None  # RATE: when the person may ask again
    limit: int = 0  # RATE: exports an hour; DISK: the budget in bytes
    used: int = 0  # DISK: bytes the export root holds


def request_export(*, run: Run, user, language: str | None = None) -> Export:
    """An export of ``run`` for ``user``, queued for the worker (nothing is read or written yet),
    to be written in ``language``: by default the one this request is read in. Raises
    ``ExportRefused`` (nothing queued) when a limit says no."""
    language = language or translation.get_language() or settings.LANGUAGE_CODE
    with transaction.atomic():  # the row and its task, or neither
        # The person's requests one after the other (PostgreSQL: a row lock until commit; SQLite's
        # transactions take the write lock at their start), so the rules below see every export
        # a request at the same moment queued.
        get_user_model().objects.select_for_update().filter(pk=user.pk).exists()
        now = protocol.utc_now()
        refusal = refusal_for(run=run, user=user, now=now)
        if refusal is not None:
            log.info("evidence export refused", extra={"event": "evidence_export_refused", "run_id": run.run_id,
                                                       "actor": user.get_username(),
                                                       "reason": refusal.reason})  # fmt: skip
            raise refusal
        export = Export.objects.create(run=run, requested_by=user, created_at=now, language=language)
        result = make_export.enqueue(export.pk)
        Export.objects.filter(pk=export.pk).update(task_id=str(result.id))
    log.info("evidence export queued", extra={"event": "evidence_export_queued", "run_id": run.run_id,
                                             "actor": user.get_username()})  # fmt: skip
    return export


def refusal_for(*, run: Run, user, now: dt.datetime) -> ExportRefused | None:
    """Why ``user`` may not ask for an export of ``run`` now, or None: the most particular rule first."""
    in_flight = (
        Export.objects.filter(run=run, requested_by=user, state__in=(Export.WAITING, Export.RUNNING))
        .exclude(worker_lost())
        .order_by("-pk")
        .first()
    )
    if in_flight is not None:
        return ExportRefused(ExportRefused.IN_FLIGHT, in_flight=in_flight)
    per_hour = settings.EVIDENCE_EXPORTS_PER_HOUR
    if per_hour:
        asked = list(
            Export.objects.filter(requested_by=user, created_at__gt=now - RATE_WINDOW)
            .order_by("created_at")
            .values_list("created_at", flat=True)
        )
        if len(asked) >= per_hour:
            # Free again once enough of these are an hour old that fewer than the limit remain.
            return ExportRefused(ExportRefused.RATE, next_at=asked[len(asked) - per_hour] + RATE_WINDOW, limit=per_hour)
    budget = settings.EVIDENCE_EXPORT_DISK_BUDGET_BYTES
    if budget:
        used = bytes_under(Path(settings.EVIDENCE_EXPORT_ROOT))
        if used >= budget:
            return ExportRefused(ExportRefused.DISK, used=used, limit=budget)
    return None


def bytes_under(root: Path) -> int:
    """What the files under ``root`` hold (zips, and what a worker is writing), 0 if it is not there."""
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except FileNotFoundError:  # removed while counted (an export renamed, the maintenance task)
                continue
    return total


@dataclasses.dataclass
class Panel:
    """What the run page shows of its exports: the newest, and whether one is still to finish."""

    rows: list[Export]

    @property
    def busy(self) -> bool:
        return any(not export.finished for export in self.rows)


def worker_lost() -> Q:
    """Running exports whose worker stopped beating their heartbeat (on the database's clock)."""
    before = ExpressionWrapper(
        Now() - dt.timedelta(seconds=settings.EVIDENCE_EXPORT_LEASE_SECONDS), output_field=DateTimeField()
    )
    quiet = Q(heartbeat_at__lt=before) | Q(heartbeat_at__isnull=True, started_at__lt=before)
    return Q(state=Export.RUNNING) & quiet


def recent(run: Run) -> Panel:
    rows: list[Export] = list(
        Export.objects.filter(run=run)
        .select_related("requested_by")
        .annotate(lost=Case(When(worker_lost(), then=Value(True)), default=Value(False), output_field=BooleanField()))
        .order_by("-created_at", "-pk")[:SHOWN_ON_THE_PAGE]
    )
    for export in rows:
        if export.lost:  # type: ignore[attr-defined]  # the annotation above; shown as what it is now; the maintenance task records it (mark_lost)
            export.state, export.error = Export.FAILED, Export.WORKER_LOST
    return Panel(rows)


def mark_lost() -> int:
    """Record every export whose worker was lost as failed (the maintenance task): how many."""
    lost = Export.objects.filter(worker_lost()).update(state=Export.FAILED, error=Export.WORKER_LOST, finished_at=Now())
    if lost:
        log.warning("evidence exports lost their worker", extra={"event": "evidence_export_lost", "count": lost})
    return lost


class Heartbeat:
    """Beats a running export's ``heartbeat_at`` from a thread of its own (with its own database
    connection) every quarter lease, however long one step of the export takes.

    On PostgreSQL only. On SQLite a write from another connection while the export reads would
    make the export's own progress write fail ("database is locked": its read snapshot can no
    longer become a write), so there each progress report beats instead (``make``)."""

    def __init__(self, export_pk: int) -> None:
        self.export_pk = export_pk
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.beat, name=f"export-{export_pk}-heartbeat", daemon=True)

    def beat(self) -> None:
        try:
            while not self.stopping.wait(settings.EVIDENCE_EXPORT_LEASE_SECONDS / 4):
                Export.objects.filter(pk=self.export_pk, state=Export.RUNNING).update(heartbeat_at=Now())
        except DatabaseError as error:  # the export goes on; the page may call it lost, and says so
            log.warning("export heartbeat stopped", extra={"event": "evidence_export_heartbeat", "detail": str(error)})
        finally:
            connection.close()  # this thread's own connection

    def __enter__(self) -> Heartbeat:
        if connection.vendor == "postgresql":
            self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join()


def stem_of(run: Run) -> str:
    # The names carry the run_id as the export shows it: a run_id the scanner redacts is its digest here too.
    return f"{file_name(run.run_id, Policy())}-evidence"


def make(export_id: int) -> Export:
    """Write the export's zip (the worker's part). A failure is kept on the row, with no file left."""
    export = Export.objects.select_related("run", "requested_by").get(pk=export_id)
    started = protocol.utc_now()
    Export.objects.filter(pk=export.pk).update(state=Export.RUNNING, started_at=started, heartbeat_at=Now())
    root = Path(settings.EVIDENCE_EXPORT_ROOT)
    target = root / f"{export.pk}-{stem_of(export.run)}.zip"
    temp = target.with_name(durable.temp_name_for(target.name))

    def progress(done: int, total: int) -> None:
        Export.objects.filter(pk=export.pk).update(done=done, total=total, heartbeat_at=Now())
        if done < total:
            durable.failpoint("export_mid_progress")  # a test holds the worker here to watch the page

    try:
        with Heartbeat(export.pk):
            root.mkdir(parents=True, exist_ok=True)
            user = export.requested_by
            with tempfile.TemporaryDirectory(dir=root, prefix=".export-") as folder:
                # The page in the language of the person who asked; evidence.json is the same in every one.
                with translation.override(export.language or settings.LANGUAGE_CODE):
                    export_run(run=export.run, out=Path(folder), policy=Policy(), progress=progress, user=user,
                               actor=user.get_username() if user else "export task")  # fmt: skip
                with zipfile.ZipFile(temp, "x", zipfile.ZIP_DEFLATED) as bundle:
                    for name in ("evidence.json", "index.html"):
                        bundle.write(Path(folder) / name, f"{stem_of(export.run)}/{name}")
            os.replace(temp, target)
    except (OSError, ValueError) as error:
        # A root that cannot be written may not be readable either: the failure is recorded whatever.
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)
        reason = reason_of(error)
        Export.objects.filter(pk=export.pk).update(
            state=Export.FAILED, error=failure_of(error), finished_at=protocol.utc_now()
        )
        log.warning("evidence export failed", extra={"event": "evidence_export_failed",
                                                     "run_id": export.run.run_id, "reason": reason})  # fmt: skip
        raise
    Export.objects.filter(pk=export.pk).update(
        state=Export.DONE, path=str(target), size=target.stat().st_size, finished_at=protocol.utc_now()
    )
    export.refresh_from_db()
    return export


def failure_of(error: OSError | ValueError) -> str:
    """What ``Export.error`` keeps of why an export failed: a code and its values (JSON), which
    the page words in its reader's language (``Export.failure``); the system's own text, when
    there is one, is kept as it is, shown as a value."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return json.dumps({"code": Export.DISK_FULL})
    return json.dumps({"code": Export.NOT_WRITTEN, "detail": reason_of(error)})


def reason_of(error: OSError | ValueError) -> str:
    """The system's own words for why an export could not be written."""
    return (error.strerror if isinstance(error, OSError) else None) or str(error)


def ready_file(export: Export) -> Path | None:
    """The zip of a finished export, while it is kept."""
    if export.state != Export.DONE or not export.path:
        return None
    path = Path(export.path)
    return path if path.is_file() else None


def newest_file(run: Run) -> Path | None:
    """The zip of the run's newest finished export, while it is kept."""
    newest = Export.objects.filter(run=run, state=Export.DONE).order_by("-finished_at", "-pk").first()
    return ready_file(newest) if newest else None


def remove_expired(*, now: dt.datetime) -> int:
    """Mark the exports whose worker was lost as failed; remove the zips of exports finished more
    than ``EVIDENCE_EXPORT_KEEP_HOURS`` ago, and their rows; the rows of exports asked for that
    long ago and never started (no worker ran them); and the temp files a killed worker left (an
    hour old)."""
    mark_lost()  # kept, as failed, as long as any finished export
    limit = now - dt.timedelta(hours=settings.EVIDENCE_EXPORT_KEEP_HOURS)
    removed = 0
    expired = Q(finished_at__lte=limit) | Q(finished_at__isnull=True, created_at__lte=limit)
    for export in Export.objects.filter(expired).iterator():
        if export.path:
            Path(export.path).unlink(missing_ok=True)
        export.delete()
        removed += 1
    root = Path(settings.EVIDENCE_EXPORT_ROOT)
    for name in os.listdir(root) if root.is_dir() else []:
        path = root / name
        if (durable.is_temp_name(name) or name.startswith(".export-")) and durable.is_old(path):
            if path.is_dir():
                import shutil

                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
    log.info("expired exports removed", extra={"event": "exports_expired", "count": removed})
    return removed


# What the worker (``manage.py db_worker``) runs of this room: each task a thin call into the code above.


@task()
def make_export(export_id: int) -> dict[str, object]:
    export = make(export_id)
    return {"export": export.pk, "size": export.size}


@task()
def remove_expired_exports() -> dict[str, object]:
    return {"exports": remove_expired(now=protocol.utc_now())}
