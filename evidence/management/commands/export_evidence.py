"""``manage.py export_evidence RUN_ID --out DIR [--policy FILE]``: redacted evidence of one run."""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import translation

from evidence.export.bundle import export_run
from evidence.export.redaction import load_policy
from evidence.models import Run


class Command(BaseCommand):
    help = "Write DIR/evidence.json and DIR/index.html: the run's evidence, redacted, with a manifest to verify."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        parser.add_argument("--out", type=Path, required=True, help="the folder to write (made if missing)")
        parser.add_argument("--policy", type=Path, default=None, help="a TOML policy: what may stay in clear")

    def handle(self, *args, run_id: str, out: Path, policy: Path | None, **options) -> None:
        # The command line writes the site's language (docs/operators.md, Languages), whatever
        # a caller in the same process (a test, a shell) left active.
        with translation.override(settings.LANGUAGE_CODE):
            self.export(run_id=run_id, out=out, policy=policy)

    def export(self, *, run_id: str, out: Path, policy: Path | None) -> None:
        run = Run.objects.filter(run_id=run_id).first()
        if run is None:
            raise CommandError(f"no run {run_id!r} is imported")
        try:
            loaded = load_policy(policy)
        except ValueError as error:
            raise CommandError(str(error)) from None
        result = export_run(run=run, out=out, policy=loaded)
        self.stdout.write(
            json.dumps({"out": str(result.directory), "counts": result.counts, "manifest": result.manifest})
        )
