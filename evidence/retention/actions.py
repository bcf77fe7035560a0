"""Retention's actions: legal holds, and applying a plan (strip the bodies, archive the run).

``strip_bodies`` and ``archive_run`` apply a plan (evidence/retention/plans.py): ``apply_due``
calls them, for ``manage.py apply_retention --apply`` and the worker's daily task
(``apply_retention``). The failpoints named in the interface docs ("Retention's failpoints") end
the process between their phases, as if it had been killed, when ``RECEIPTS_FAILPOINT`` names them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from django.conf import settings
from django_tasks import task

from evidence.lib import hosts, stats
from evidence.lib.pagination import every_row
from evidence.models import AuditEntry, Call, Host, Run, ShippedRun
from evidence.retention.plans import (
    ARCHIVE,
    KEEP,
    STRIP_BODIES,
    RetentionPolicy,
    RunPlan,
    plan_runs,
    plan_segment,
    replanned,
)
from receipts import confined, durable, protocol
from receipts.reader import birth_digest

# --- legal holds ----------------------------------------------------------------

log = logging.getLogger("callproof.retention")


def set_legal_hold(*, run: Run, user, hold: bool, reason: str, now: dt.datetime) -> AuditEntry:
    """Set (``hold``) or lift a legal hold, with a reason; both are audited and restart the clock."""
    from django.db import transaction

    if not reason.strip():
        raise ValueError("a legal hold is set or lifted with a reason")
    with transaction.atomic():
        # The run's row is locked first, as retention locks it to re-check its plan before it
        # strips or marks the run archived: a hold set meanwhile waits, or stops it.
        Run.objects.select_for_update().filter(pk=run.pk).update(
            legal_hold=hold,
            legal_hold_reason=reason.strip() if hold else "",
            legal_hold_by=user.get_username() if hold else "",
            legal_hold_since=now,  # lifting restarts the clock too: someone looked at the run
        )
        action = AuditEntry.LEGAL_HOLD_SET if hold else AuditEntry.LEGAL_HOLD_LIFTED
        log.info(action.replace("_", " "), extra={"event": action, "run_id": run.run_id, "actor": user.get_username()})
        entry = AuditEntry.objects.create(
            run=run, action=action, actor=user.get_username(), user=user, at=now, reason=reason.strip()
        )
        stats.refresh_run_summary(run)  # a hold keeps the run, and restarts its clock
        return entry


def audit(*, run: Run, action: str, now: dt.datetime, reason: str) -> None:
    """An entry for what a command did, beside what people did; and a log line."""
    AuditEntry.objects.create(run=run, action=action, actor="apply_retention", at=now, reason=reason)
    log.info(action.replace("_", " "), extra={"event": action, "run_id": run.run_id, "reason": reason})


def sweep_writer_locks(run: Run) -> int:
    """Remove the writer's lock files of a finished run that nobody holds, and the temp files dead
    writers left; the counter stays. Through the writer, which takes each lock before it unlinks it."""
    run_dir = Path(run.path)
    try:
        temps = durable.sweep_temp_files(run_dir)  # first: it takes (and leaves) the sweep's own lock
        return len(durable.sweep_locks(run_dir)) + len(temps)
    except (confined.UnsafePath, PermissionError) as unsafe:
        # A symlinked .writer/ is never entered: what it points at is not the run's to sweep. One
        # the writer daemon's user keeps to itself (callproof serve) is that user's to sweep.
        log.warning("writer files not swept", extra={"event": "sweep_refused", "run_id": run.run_id,
                                                     "reason": str(unsafe)})  # fmt: skip
        return 0


# --- applying the plan -------------------------------------------------------


def apply_due(
    *, now: dt.datetime, apply: bool, host: Host | None = None, due_only: bool = False
) -> list[dict[str, object]]:
    """Each run's plan (run_id, action, blockers, reason), and with ``apply`` what was done to it;
    only ``host``'s runs when given; only the runs something is due for with ``due_only`` (a
    watch's retention: a cold run nothing is due for is not even looked at, its lock files are
    swept when its archive is).

    Only the run's own host touches its files (``hosts.owns``): elsewhere the bodies are
    stripped (that is the database's) and the archive is left to the host, whose watch applies
    retention to its own runs (``import_runs --watch``)."""
    policy = RetentionPolicy.from_settings()
    if due_only:
        plans = [plan for action in (STRIP_BODIES, ARCHIVE)
                 for plan in every_row(plan_segment(policy=policy, now=now, action=action, host=host))]  # fmt: skip
    else:
        plans = list(plan_runs(policy=policy, now=now, host=host))
    if apply:
        sweep_temp_archives(Path(settings.EVIDENCE_ARCHIVE_ROOT))  # what killed applies left
    results = []
    for plan in plans:
        result: dict[str, object] = {
            "run_id": plan.run_id,
            "action": plan.action,
            "blockers": plan.blockers,
            "reason": plan.reason,
        }
        if apply:
            result.update(_apply_plan(plan, policy, now))
        results.append(result)
    if apply:
        # Runs marked archived whose directory (or its renamed copy) a killed apply left behind.
        archived = Run.objects.filter(archived=True).select_related("host")
        for run in unfinished_removals(run for run in archived if files_are_here(run)):
            remove_run_directory(run)
    return results


def files_are_here(run: Run) -> bool:
    """Whether this process may act on the run's files: it runs on the run's own host, or the run
    was shipped (``callproof ship``) and its files are the server's mirror of it."""
    return hosts.owns(run) or Path(run.path).is_relative_to(Path(settings.EVIDENCE_MIRROR_ROOT))


def holds_the_run(run: Run) -> bool:
    """Whether the directory at the run's path still holds the run imported from it: its
    steer.json is the one the import read (a run imported before that was recorded: yes)."""
    return not run.steer_sha256 or birth_digest(Path(run.path)) == run.steer_sha256


def _apply_plan(plan: RunPlan, policy: RetentionPolicy, now: dt.datetime) -> dict[str, object]:
    from django.db import transaction

    run = Run.objects.select_related("host").get(run_id=plan.run_id)
    own = files_are_here(run)
    if own and not plan.blockers and not run.archived and Path(run.path).is_dir() and holds_the_run(run):
        sweep_writer_locks(run)  # a finished run writes nothing more
    if plan.action == KEEP:
        return {"applied": "nothing"}
    with transaction.atomic():  # the bodies stripped and its audit entry, or neither
        run, now_planned = replanned(plan.run_id, policy, now)
        if now_planned.action == KEEP:
            return {"applied": "nothing", "error": f"kept since the plan was made: {now_planned.reason}"}
        strip_bodies(run=run, now=now)
        audit(run=run, action=AuditEntry.BODIES_STRIPPED, now=now, reason=plan.reason)
    durable.failpoint("retention_after_strip")
    if plan.action == STRIP_BODIES:
        return {"applied": "stripped"}
    if not own:
        return {"applied": "stripped", "error": f"archived by its own host, {run.host.name if run.host else '?'}"}
    try:
        archive = archive_run(
            run=run, archive_root=Path(settings.EVIDENCE_ARCHIVE_ROOT), now=now, reason=plan.reason, policy=policy
        )
    except (ArchiveError, OSError) as error:
        return {"applied": "nothing archived", "error": str(error)}
    return {"applied": "archived", "archive": str(archive)}


class ArchiveError(Exception):
    """The archive could not be made and checked: nothing was removed."""


def _digests_of(values: object) -> object:
    """An object's fields each replaced by the digest of its canonical JSON (the export's redaction marker)."""
    if isinstance(values, dict):
        return {name: protocol.redacted(value) for name, value in values.items()}
    return protocol.redacted(values)


def strip_bodies(*, run: Run, now: dt.datetime) -> None:
    """Replace the run's bodies (args, results, errors, requests, event payload fields) by their digests.

    Ids, digests, statuses, tools, times and counts stay, so every page, the
    identity verdicts stored at import and an export keep working. Idempotent.
    """
    from django.db import transaction

    from evidence.models import Event, Submission

    with transaction.atomic():
        calls = list(Call.objects.filter(run=run))
        for call in calls:
            call.args = _digests_of(call.args) if call.args is not None else None
            call.result = protocol.redacted(call.result) if call.result is not None else None
            call.error = protocol.redacted(call.error) if call.error is not None else None
        Call.objects.bulk_update(calls, ["args", "result", "error"], batch_size=1000)
        submissions = list(Submission.objects.filter(run=run))
        for submission in submissions:
            submission.request = protocol.redacted(submission.request) if submission.request is not None else None
        Submission.objects.bulk_update(submissions, ["request"], batch_size=1000)
        durable.failpoint("retention_mid_strip")  # calls and submissions stripped, events not yet
        batch: list[Event] = []
        for event in Event.objects.filter(run=run).order_by("seq").iterator(5000):
            payload = event.payload if isinstance(event.payload, dict) else {}
            event.payload = {
                k: (v if k in protocol.EVENT_FACT_FIELDS else protocol.redacted(v)) for k, v in payload.items()
            }
            batch.append(event)
            if len(batch) >= 5000:
                Event.objects.bulk_update(batch, ["payload"])
                batch = []
        Event.objects.bulk_update(batch, ["payload"])
        if run.bodies_stripped_at is None:
            Run.objects.filter(pk=run.pk).update(bodies_stripped_at=now)
        stats.refresh_run_summary(run)  # what the bodies weigh now


def archive_run(
    *, run: Run, archive_root: Path, now: dt.datetime, reason: str, policy: RetentionPolicy | None = None
) -> Path:
    """Pack the run directory into ``<archive_root>/<run_id>.tar.gz`` (with its SHA-256 beside it),
    read it back and compare every file, mark the run archived (with its audit entry, ``reason``,
    in one transaction), and only then remove the directory.

    Refused (``ArchiveError``, nothing removed) when the directory holds another run than the
    one imported (``holds_the_run``), or when, at the moment of marking it, the run's plan no
    longer archives it (a legal hold set while it was packed): the archive made is removed.

    A kill at any moment leaves the run either untouched (no archive yet, or an
    archive not yet marked) or archived in the database with its directory, or
    the dot name it was renamed to, still to remove; calling this again (or
    ``remove_run_directory``) finishes the job.
    """
    from django.db import transaction

    run_dir = Path(run.path)
    target = Path(archive_root) / f"{run.run_id}.tar.gz"
    if not run.archived:
        Path(archive_root).mkdir(parents=True, exist_ok=True)
        if not run_dir.is_dir():
            raise ArchiveError(f"{run_dir} is not there to archive")
        if not holds_the_run(run):
            raise ArchiveError(f"{run_dir} holds another run than the one imported (its steer.json differs): "
                               "nothing archived or removed")  # fmt: skip
        _pack(run_dir, target)
        durable.failpoint("retention_after_archive_written")
        problems = _compare(run_dir, target)
        if problems:
            target.unlink(missing_ok=True)
            raise ArchiveError("the archive does not hold the run: " + "; ".join(problems[:5]))
        durable.failpoint("retention_after_read_back")
        with transaction.atomic():  # archived and its audit entry, or neither
            _, now_planned = replanned(run.run_id, policy or RetentionPolicy.from_settings(), now)
            if now_planned.action != ARCHIVE:
                target.unlink(missing_ok=True)
                target.with_name(target.name + ".sha256").unlink(missing_ok=True)
                raise ArchiveError(f"kept since the plan was made: {now_planned.reason}; nothing removed")
            Run.objects.filter(pk=run.pk).update(archived=True, archived_at=now, archive_path=str(target))
            audit(run=run, action=AuditEntry.RUN_ARCHIVED, now=now, reason=f"{reason}: {target}")
        durable.failpoint("retention_after_marked_archived")
    remove_run_directory(run)
    return target


def _renamed_from(name: str) -> str | None:
    """The run directory's name when ``name`` is a dot name ``remove_run_directory`` renamed it to."""
    head, marker, pid = name.rpartition(".archived-")
    return head[1:] if marker and head.startswith(".") and len(head) > 1 and pid.isdigit() else None


def remove_run_directory(run: Run) -> None:
    """Remove an archived run's directory, and any renamed copy of it that a killed apply left."""
    import shutil

    run_dir = Path(run.path)
    if run_dir.is_dir() and holds_the_run(run):  # another run under its id stays (a finding says so)
        # Renamed first (a dot name, which no reader lists), so the run is never seen half removed.
        doomed = run_dir.with_name(f".{run_dir.name}.archived-{os.getpid()}")
        os.replace(run_dir, doomed)
        durable.fsync_directory(run_dir.parent, None)
        durable.failpoint("retention_after_run_dir_renamed")
        shutil.rmtree(doomed)
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(run_dir.parent):
            if _renamed_from(name) == run_dir.name:  # what a killed apply renamed and never removed
                shutil.rmtree(run_dir.with_name(name), ignore_errors=True)
    if run.host is not None and run_dir.is_relative_to(Path(settings.EVIDENCE_MIRROR_ROOT)):
        # The mirror's copy of a shipped run is gone on purpose: it no longer counts against its
        # host's quota, and nothing of it is behind (evidence/ingest/mirror.py).
        ShippedRun.objects.filter(host=run.host, run_id=run.run_id).update(
            mirror_bytes=0, mirror_ledger_bytes=0, host_ledger_bytes=0, behind_since=None, arriving=False
        )


def unfinished_removals(runs: Iterable[Run]) -> list[Run]:
    """The archived ``runs`` whose directory, or a renamed copy of it, a killed apply left behind
    (each runs root is listed once)."""
    runs = list(runs)
    left: dict[Path, set[str]] = {}  # per runs root: the names of directories there, renamed or not
    for parent in {Path(run.path).parent for run in runs}:
        try:
            names = os.listdir(parent)
        except FileNotFoundError:
            names = []
        left[parent] = {_renamed_from(name) or name for name in names}
    return [run for run in runs if Path(run.path).name in left[Path(run.path).parent]]


def sweep_temp_archives(archive_root: Path) -> list[Path]:
    """Remove the temp archives killed applies left in ``archive_root``: those not written to for an
    hour (``durable.TEMP_SWEEP_AGE_SECONDS``; one being packed changes as it grows)."""
    try:
        names = os.listdir(archive_root)
    except FileNotFoundError:
        return []
    temps = [Path(archive_root) / name for name in names if durable.is_temp_name(name) and ".tar.gz." in name]
    return [temp for temp in temps if durable.is_old(temp) and durable.remove_file(temp, None)]


def _pack(run_dir: Path, target: Path) -> None:
    import tarfile

    temp = target.with_name(durable.temp_name_for(target.name))
    try:
        with open(temp, "xb") as raw:
            with tarfile.open(fileobj=raw, mode="w:gz") as archive:
                archive.add(run_dir, arcname=run_dir.name, recursive=True)
            raw.flush()
            os.fsync(raw.fileno())
        durable.failpoint("retention_after_archive_temp")
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    with open(target, "rb") as packed:  # streamed: an archive may be larger than memory
        digest = hashlib.file_digest(packed, "sha256").hexdigest()
    durable.write_durable(target.with_name(target.name + ".sha256"), f"{digest}  {target.name}\n".encode(), root=None)
    durable.fsync_directory(target.parent, None)


def _compare(run_dir: Path, target: Path) -> list[str]:
    """Every regular file under the run directory, byte for byte in the archive (and nothing missing)."""
    import tarfile

    problems = []
    try:
        with tarfile.open(target, "r:gz") as archive:
            members = {member.name: member for member in archive.getmembers() if member.isfile()}
            for folder, _, names in os.walk(run_dir):
                for name in names:
                    path = Path(folder) / name
                    if path.is_symlink() or not path.is_file():
                        continue
                    key = str(Path(run_dir.name) / path.relative_to(run_dir))
                    member = members.get(key)
                    if member is None:
                        problems.append(f"{key} is missing")
                        continue
                    stored = archive.extractfile(member)  # a regular member's: never None
                    if stored is None or stored.read() != path.read_bytes():
                        problems.append(f"{key} differs")
    except (OSError, tarfile.TarError) as error:
        problems.append(f"the archive cannot be read back: {error}")
    return problems


@task()
def apply_retention() -> dict[str, object]:
    """What the worker runs daily: every run's plan applied (``apply_due``)."""
    results = apply_due(now=protocol.utc_now(), apply=True)
    applied = [result for result in results if result.get("applied") not in (None, "nothing")]
    log.info("retention applied", extra={"event": "retention_applied", "count": len(applied)})
    return {"runs": len(results), "applied": applied}
