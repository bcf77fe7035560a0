"""An abandoned run that writes again (run by hand; not part of the suite): the time from a call
in doubt written into it to its row, with a real ``import_runs --watch``.

``--runs`` runs are made by the writer and imported once; then a watch starts (its default
interval, 3 s) with its clock a day and a half on, standing still (``RECEIPTS_CLOCK``): its first
pass finds every run abandoned, and the cold sweep never comes. Then, one run after another, the
runtime comes back (the writer with the watch's clock) and is killed after a send's effect; the
benchmark times each from the kill to the call in doubt in the database.

    python tests/bench/bench_abandoned.py [--runs N]
"""

from __future__ import annotations

import argparse
import datetime as dt
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    options = parser.parse_args()
    sys.path.insert(0, str(PROJECT))
    work = OUT / "abandoned"
    shutil.rmtree(work, ignore_errors=True)
    root = work / "runs"
    root.mkdir(parents=True)
    url = f"sqlite:///{work / 'db.sqlite3'}"
    os.environ.update({"DATABASE_URL": url, "DJANGO_DEBUG": "1", "DJANGO_SETTINGS_MODULE": "evidence.settings"})
    manage = [sys.executable, str(PROJECT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], check=True, cwd=PROJECT)
    import django

    django.setup()
    from evidence.models import Call, Run
    from receipts import protocol, runtime

    for number in range(options.runs):
        run_dir = root / f"paused-{number:02d}"
        runtime.run_init(run_dir, contract_sha256=CONTRACT)
        runtime.Executor(run_dir).call("write_file", {"path": f"{number}.txt", "content": "before the pause"})
    subprocess.run([*manage, "import_runs", str(root)], check=True, cwd=PROJECT, capture_output=True)
    clock = protocol.format_time(protocol.utc_now() + dt.timedelta(hours=36))
    watch = subprocess.Popen([*manage, "import_runs", str(root), "--watch"], cwd=PROJECT,
                             env={**os.environ, "RECEIPTS_CLOCK": clock}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip
    seconds = []
    try:
        while Run.objects.filter(abandoned_at__isnull=False).count() < options.runs:
            assert watch.poll() is None, "the watch ended"
            time.sleep(0.2)
        for number in range(options.runs):
            run_dir = root / f"paused-{number:02d}"
            message = json.dumps({"to": f"customer-{number}@example.com", "body": "the runtime is back"})
            subprocess.run([sys.executable, "-m", "receipts", "call", str(run_dir), "--tool", "send_message",
                            "--attempt", "1", "--args", message], cwd=PROJECT,
                           env={**os.environ, "RECEIPTS_FAILPOINT": "after_effect", "RECEIPTS_CLOCK": clock},
                           check=False)  # fmt: skip
            killed = time.monotonic()
            doubts = Call.objects.in_doubt().filter(run__run_id=run_dir.name)
            while not doubts.exists():
                assert watch.poll() is None, "the watch ended"
                time.sleep(0.02)
            seconds.append(time.monotonic() - killed)
            time.sleep(1)
    finally:
        watch.send_signal(signal.SIGTERM)
        watch.wait(60)
    ordered = sorted(seconds)
    p95 = ordered[max(0, round(0.95 * len(ordered)) - 1)]
    print(f"{len(seconds)} abandoned runs written into again, each with a call in doubt")
    print(f"  killed writer to the call in doubt stored: p50 {statistics.median(seconds):.2f} s, p95 {p95:.2f} s, "
          f"max {max(seconds):.2f} s")  # fmt: skip
    print(json.dumps({"runs": options.runs, "seconds": seconds}))


if __name__ == "__main__":
    main()
