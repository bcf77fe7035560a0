"""``manage.py apply_retention [--json] [--apply]``: each run's retention plan, applied only with ``--apply``."""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from evidence import retention
from evidence.models import AuditEntry, Run
from receipts import durable, protocol


class Command(BaseCommand):
    help = (
        "Print what the retention policy says is due for each run, and what keeps a run. "
        "Changes nothing unless --apply: then bodies are stripped and runs archived under EVIDENCE_ARCHIVE_ROOT."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the plan as one JSON document")
        parser.add_argument("--apply", action="store_true", help="strip and archive what is due (default: plan only)")

    def handle(self, *args, **options) -> None:
        now = protocol.utc_now()
        plans = list(retention.plan_runs(policy=retention.RetentionPolicy.from_settings(), now=now))
        if options["apply"]:
            retention.sweep_temp_archives(Path(settings.EVIDENCE_ARCHIVE_ROOT))  # what killed applies left
        results = []
        for plan in plans:
            result: dict[str, object] = {
                "run_id": plan.run_id,
                "action": plan.action,
                "blockers": plan.blockers,
                "reason": plan.reason,
            }
            if options["apply"]:
                result.update(self.apply(plan, now))
            results.append(result)
        if options["apply"]:
            # Runs marked archived whose directory (or its renamed copy) a killed apply left behind.
            for run in retention.unfinished_removals(Run.objects.filter(archived=True)):
                retention.remove_run_directory(run)
        if options["json"]:
            self.stdout.write(json.dumps({"runs": results}, ensure_ascii=False))
            return
        for result in results:
            applied = f" [{result['applied']}]" if "applied" in result else ""
            self.stdout.write(f"{result['run_id']}: {result['action']}{applied}; {result['reason']}")

    def apply(self, plan: retention.RunPlan, now) -> dict[str, object]:
        run = Run.objects.get(run_id=plan.run_id)
        if not plan.blockers and not run.archived and Path(run.path).is_dir():
            retention.sweep_writer_locks(run)  # a finished run writes nothing more
        if plan.action == retention.KEEP:
            return {"applied": "nothing"}
        with transaction.atomic():  # the bodies stripped and its audit entry, or neither
            retention.strip_bodies(run=run, now=now)
            retention.audit(run=run, action=AuditEntry.BODIES_STRIPPED, now=now, reason=plan.reason)
        durable.failpoint("retention_after_strip")
        if plan.action == retention.STRIP_BODIES:
            return {"applied": "stripped"}
        try:
            archive_root = Path(settings.EVIDENCE_ARCHIVE_ROOT)
            archive = retention.archive_run(run=run, archive_root=archive_root, now=now, reason=plan.reason)
        except (retention.ArchiveError, OSError) as error:
            return {"applied": "nothing archived", "error": str(error)}
        return {"applied": "archived", "archive": str(archive)}
