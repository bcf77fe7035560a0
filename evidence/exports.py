"""Evidence exports people ask for on a run's page: queued in a request, made by the worker.

The request only writes an ``Export`` row and queues ``tasks.make_export``; the worker writes
the zip (evidence/export.py, telling the row how far it is) under ``EVIDENCE_EXPORT_ROOT``, as a
temp file renamed into place once whole, so a failed export leaves no file; the maintenance
task removes what finished more than ``EVIDENCE_EXPORT_KEEP_HOURS`` ago.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import tempfile
import zipfile
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import translation

from evidence.export import export_run
from evidence.models import Export, Run
from evidence.redaction import Policy, file_name
from receipts import durable, protocol

log = logging.getLogger("callproof.export")

SHOWN_ON_THE_PAGE = 5  # the run page lists this many of its newest exports


def request_export(*, run: Run, user, language: str | None = None) -> Export:
    """An export of ``run`` for ``user``, queued for the worker (nothing is read or written yet),
    to be written in ``language``: by default the one this request is read in."""
    from evidence import tasks

    language = language or translation.get_language() or settings.LANGUAGE_CODE
    with transaction.atomic():  # the row and its task, or neither
        export = Export.objects.create(run=run, requested_by=user, created_at=protocol.utc_now(), language=language)
        result = tasks.make_export.enqueue(export.pk)
        Export.objects.filter(pk=export.pk).update(task_id=str(result.id))
    log.info("evidence export queued", extra={"event": "evidence_export_queued", "run_id": run.run_id,
                                             "actor": user.get_username()})  # fmt: skip
    return export


@dataclasses.dataclass
class Panel:
    """What the run page shows of its exports: the newest, and whether one is still to finish."""

    rows: list[Export]

    @property
    def busy(self) -> bool:
        return any(not export.finished for export in self.rows)


def recent(run: Run) -> Panel:
    return Panel(
        list(
            Export.objects.filter(run=run)
            .select_related("requested_by")
            .order_by("-created_at", "-pk")[:SHOWN_ON_THE_PAGE]
        )
    )


def stem_of(run: Run) -> str:
    # The names carry the run_id as the export shows it: a run_id the scanner redacts is its digest here too.
    return f"{file_name(run.run_id, Policy())}-evidence"


def make(export_id: int) -> Export:
    """Write the export's zip (the worker's part). A failure is kept on the row, with no file left."""
    export = Export.objects.select_related("run", "requested_by").get(pk=export_id)
    started = protocol.utc_now()
    Export.objects.filter(pk=export.pk).update(state=Export.RUNNING, started_at=started)
    root = Path(settings.EVIDENCE_EXPORT_ROOT)
    target = root / f"{export.pk}-{stem_of(export.run)}.zip"
    temp = target.with_name(durable.temp_name_for(target.name))

    def progress(done: int, total: int) -> None:
        Export.objects.filter(pk=export.pk).update(done=done, total=total)

    try:
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
        temp.unlink(missing_ok=True)
        reason = (error.strerror if isinstance(error, OSError) else None) or str(error)
        Export.objects.filter(pk=export.pk).update(
            state=Export.FAILED, error=f"the export could not be written: {reason}", finished_at=protocol.utc_now()
        )
        log.warning("evidence export failed", extra={"event": "evidence_export_failed",
                                                     "run_id": export.run.run_id, "reason": reason})  # fmt: skip
        raise
    Export.objects.filter(pk=export.pk).update(
        state=Export.DONE, path=str(target), size=target.stat().st_size, finished_at=protocol.utc_now()
    )
    export.refresh_from_db()
    return export


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
    """Remove the zips of exports finished more than ``EVIDENCE_EXPORT_KEEP_HOURS`` ago, and their
    rows; the rows of exports asked for that long ago and never finished (a worker killed under
    them: the page would wait for ever); and the temp files such a worker left (an hour old)."""
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
