"""Export benchmark (run by hand: `make bench-export`; not part of the suite).

Builds (once, cached under tests/bench/out/) a run of N ledger events and N/10
receipts, imports it into a fresh SQLite database, then times
``manage.py export_evidence`` and ``manage.py verify_evidence`` and reports each
one's peak memory, at a quarter of N and at N (flat = streamed). Then the same
export through the run page: the POST's response time (Django's test client, the
page warmed up), and the export's time in ``manage.py db_worker --batch``.

    python tests/bench/bench_export.py [--events N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.bench_import import OUT, PROJECT, build_run, manage

THROUGH_THE_PAGE = """
import time
from django.contrib.auth.models import User
from django.test import Client
from evidence.models import Export
from evidence.lib.roles import ensure_roles
user, _ = User.objects.get_or_create(username="bench")
user.groups.add(ensure_roles()["exporter"])
client = Client()
client.force_login(user)
run_id = "{run_id}"
client.get(f"/runs/{{run_id}}/")
started = time.perf_counter()
assert client.post(f"/runs/{{run_id}}/export/").status_code == 303
print((time.perf_counter() - started) * 1000, Export.objects.latest("pk").state)
"""
WORKED = """
from evidence.models import Export
export = Export.objects.latest("pk")
print(export.state, (export.finished_at - export.started_at).total_seconds(), export.size)
"""


def shell(url: str, code: str, env: dict[str, str]) -> str:
    command = [sys.executable, "manage.py", "shell", "-v", "0", "-c", code]
    child = {**os.environ, "DATABASE_URL": url, "DJANGO_DEBUG": "1", "DJANGO_ALLOWED_HOSTS": "testserver", **env}
    return subprocess.run(command, cwd=PROJECT, env=child, capture_output=True, text=True, check=True).stdout.strip()


def through_the_page(url: str, run_id: str, events: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        env = {"EVIDENCE_EXPORT_ROOT": root}
        answered, state = shell(url, THROUGH_THE_PAGE.format(run_id=run_id), env).split()
        worker = [sys.executable, "manage.py", "db_worker", "--batch", "--no-reload", "--no-startup-delay"]
        subprocess.run(worker, cwd=PROJECT, env={**os.environ, "DATABASE_URL": url, "DJANGO_DEBUG": "1", **env},
                       capture_output=True, check=True)  # fmt: skip
        done, seconds, size = shell(url, WORKED, env).split()
    print(f"{events:>9,} events: the page's POST answered in {float(answered):.0f} ms ({state}); "
          f"the worker's export {float(seconds):.1f} s ({done}, zip {int(size) / 2**20:.1f} MiB)")  # fmt: skip


def measure(events: int) -> None:
    run = build_run(events, events // 10)
    database = OUT / f"export-{events}.sqlite3"
    database.unlink(missing_ok=True)
    url = f"sqlite:///{database}"
    manage(url, "migrate", "-v", "0")
    manage(url, "import_runs", str(run))
    out = OUT / f"export-{events}"
    shutil.rmtree(out, ignore_errors=True)
    seconds, peak, _ = manage(url, "export_evidence", run.name, "--out", str(out))
    size = (out / "evidence.json").stat().st_size / 2**20
    print(f"{events:>9,} events: export {seconds:6.1f} s, peak {peak:5.0f} MiB, evidence.json {size:6.1f} MiB")
    seconds, peak, _ = manage(url, "verify_evidence", str(out))
    print(f"{events:>9,} events: verify {seconds:6.1f} s, peak {peak:5.0f} MiB")
    through_the_page(url, run.name, events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    options = parser.parse_args()
    for events in (options.events // 4, options.events):
        measure(events)


if __name__ == "__main__":
    main()
