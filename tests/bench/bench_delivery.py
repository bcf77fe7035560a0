"""Delivery benchmark (run by hand; not part of the suite): a decision's way to its run directory
while the host's watch imports a big run.

On PostgreSQL (the database ``imp_delivery``, made again by each run), a real ``import_runs
--watch`` ships a runs root of ``--doubts`` small runs, each with one message in doubt (the
writer killed after the effect). Once they are imported, a run of ``--events`` ledger events is
put in the root (built once, cached under tests/bench/out/), and while the watch's pass imports
it, this process settles the calls one after another as a web process on another machine does
(``settle.settle_call``) and times each settle until its confirmation file is in the run
directory. It says how many were settled while the big import was still under way.

    python tests/bench/bench_delivery.py [--events N] [--doubts N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "out"
CONTRACT = "c" * 64
PG_SERVER = "postgres://postgres@127.0.0.1:5432"
PG_NAME = "imp_delivery"


def fresh_database(name: str = PG_NAME) -> str:
    """The PostgreSQL database ``name``, dropped and made again, migrated: its URL."""
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    url = f"{PG_SERVER}/{name}"
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_DEBUG": "1"}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], env=env, cwd=PROJECT, check=True)
    return url


def big_run(events: int) -> Path:
    from tests.volume import synthetic_run

    run_dir = OUT / f"delivery-big-{events}" / "big-run"
    if not (run_dir.parent / ".built").exists():
        shutil.rmtree(run_dir.parent, ignore_errors=True)
        synthetic_run(run_dir, events=events, receipts=events // 10, contract=CONTRACT)
        (run_dir.parent / ".built").touch()
    return run_dir


def doubtful_runs(root: Path, count: int) -> list[Path]:
    """``count`` runs, each with a message sent and its writer killed before the commit."""
    from receipts import runtime

    made = []
    for number in range(count):
        run_dir = root / f"doubt-{number:02d}"
        runtime.run_init(run_dir, contract_sha256=CONTRACT)
        message = json.dumps({"to": f"customer-{number}@example.com", "body": "Your refund is on its way"})
        command = [sys.executable, "-m", "receipts", "call", str(run_dir), "--tool", "send_message",
                   "--attempt", "1", "--args", message]  # fmt: skip
        subprocess.run(command, env={**os.environ, "RECEIPTS_FAILPOINT": "after_effect"}, cwd=PROJECT, check=False)
        made.append(run_dir)
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--doubts", type=int, default=20)
    options = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    sys.path.insert(0, str(PROJECT))
    big = big_run(options.events)
    root = OUT / "delivery-root"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    runs = doubtful_runs(root, options.doubts)
    url = fresh_database()
    os.environ.update({"DATABASE_URL": url, "DJANGO_DEBUG": "1", "DJANGO_SETTINGS_MODULE": "evidence.settings"})
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import User

    from evidence.lib import roles
    from evidence.models import Call, Run
    from evidence.review import settle

    env = {**os.environ, "EVIDENCE_HOST_NAME": "agent-host"}
    watch = subprocess.Popen([sys.executable, "manage.py", "import_runs", str(root), "--watch"], cwd=PROJECT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while Run.objects.filter(run_id__startswith="doubt-").count() < len(runs):
            assert time.monotonic() < deadline and watch.poll() is None, "the small runs were never imported"
            time.sleep(0.2)
        person = User.objects.create_user("dana")
        person.groups.add(roles.ensure_roles()["confirmer"])
        shutil.copytree(big, root / big.name)  # the next pass imports it
        copied = time.monotonic()
        time.sleep(3)  # the pass is under way
        seconds, during = [], 0
        settings.EVIDENCE_HOST_NAME = "web-host"  # settled away from the run's host: the watch delivers
        for run_dir in runs:
            call = Call.objects.select_related("run").get(run__run_id=run_dir.name)
            confirmation = run_dir / "confirmations" / f"{call.call_id}.json"
            started = time.monotonic()
            settle.settle_call(run=call.run, call=call, user=person, resolution="committed", reason="the log has it",
                               typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256)  # fmt: skip
            while not confirmation.exists():
                time.sleep(0.02)
            seconds.append(time.monotonic() - started)
            imported = Run.objects.filter(run_id=big.name, imported_at__isnull=False).exists()
            during += not imported
        deadline = time.monotonic() + 1800
        while not Run.objects.filter(run_id=big.name, imported_at__isnull=False).exists():
            assert time.monotonic() < deadline and watch.poll() is None, "the big run was never imported"
            time.sleep(0.5)
        big_import = time.monotonic() - copied
    finally:
        watch.send_signal(signal.SIGTERM)
        watch.communicate(timeout=120)
    ordered = sorted(seconds)
    p95 = ordered[max(0, round(0.95 * len(ordered)) - 1)]
    print(f"PostgreSQL: {len(seconds)} decisions settled while a run of {options.events:,} events was imported")
    print(f"  the big run imported {big_import:.1f} s after it was put in the root")
    print(f"  settled while the big import was under way: {during} of {len(seconds)}")
    print(f"  settle to confirmation file: p50 {statistics.median(seconds):.2f} s, p95 {p95:.2f} s, "
          f"max {max(seconds):.2f} s")  # fmt: skip
    print(json.dumps({"events": options.events, "decisions": len(seconds), "during_import": during,
                      "big_import_s": big_import, "seconds": seconds}))  # fmt: skip


if __name__ == "__main__":
    main()
