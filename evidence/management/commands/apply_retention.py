"""``manage.py apply_retention [--json] [--apply]``: each run's retention plan, applied only with ``--apply``."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandParser

from evidence.retention import actions
from receipts import protocol


class Command(BaseCommand):
    help = (
        "Print what the retention policy says is due for each run, and what keeps a run. "
        "Changes nothing unless --apply: then bodies are stripped and runs archived under EVIDENCE_ARCHIVE_ROOT."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the plan as one JSON document")
        parser.add_argument("--apply", action="store_true", help="strip and archive what is due (default: plan only)")

    def handle(self, *args, **options) -> None:
        results = actions.apply_due(now=protocol.utc_now(), apply=options["apply"])
        if options["json"]:
            self.stdout.write(json.dumps({"runs": results}, ensure_ascii=False))
            return
        for result in results:
            applied = f" [{result['applied']}]" if "applied" in result else ""
            self.stdout.write(f"{result['run_id']}: {result['action']}{applied}; {result['reason']}")
