"""``manage.py apply_retention [--json]``: each run's retention plan (planning only: it changes nothing)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandParser

from receipts import protocol, retention


class Command(BaseCommand):
    help = (
        "Print what the retention policy says is due for each run, and what keeps a run. "
        "It changes nothing: applying the plan (stripping bodies, archiving) is not built yet."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the plan as one JSON document")

    def handle(self, *args, **options) -> None:
        plans = retention.plan_runs(policy=retention.RetentionPolicy.from_settings(), now=protocol.utc_now())
        if options["json"]:
            runs = [
                {"run_id": plan.run_id, "action": plan.action, "blockers": plan.blockers, "reason": plan.reason}
                for plan in plans
            ]
            self.stdout.write(json.dumps({"runs": runs}, ensure_ascii=False))
            return
        for plan in plans:
            self.stdout.write(f"{plan.run_id}: {plan.action}; {plan.reason}")
