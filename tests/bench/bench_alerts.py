"""Alerts benchmark (run by hand; not part of the suite): from a call entering doubt to the
webhook's POST.

A real ``import_runs --watch`` (its default 3 s interval) and a real worker (``db_worker``, its
default 1 s poll) run as processes on a fresh database, with one notification rule whose webhook
is a real receiver on 127.0.0.1 (tests/webhook_receiver.py, a process). Each trial makes a new
run in the watched root and has the real writer send a message and die after the effect: its
receipt is written, the call is in doubt. The time is from that receipt's file (its mtime) to
the receiver's arrival of the POST about it. Prints p50, p95 and the worst.

    python tests/bench/bench_alerts.py [--trials 20] [--database sqlite|postgres]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
CONTRACT = "c" * 64
PG_SERVER = "postgres://postgres@127.0.0.1:5432"
SECRET = "bench-secret"
RULE = (
    "from evidence.models import NotificationRule; from receipts import protocol; "
    "NotificationRule.objects.create(name='bench', channel='webhook', url='{url}', secret='{secret}', "
    "kinds='in doubt', created_at=protocol.utc_now())"
)


def database(kind: str, folder: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{folder / 'bench.sqlite3'}"
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS imp_alerts")
        conn.execute("CREATE DATABASE imp_alerts")
    return f"{PG_SERVER}/imp_alerts"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    options = parser.parse_args()
    sys.path.insert(0, str(PROJECT))
    from receipts import runtime

    folder = Path(tempfile.mkdtemp(prefix="bench-alerts-"))
    root = folder / "runs"
    root.mkdir()
    url = database(options.database, folder)
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_DEBUG": "1", "EVIDENCE_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1"}
    env |= {"EVIDENCE_PUBLIC_URL": "https://callproof.example.com", "EVIDENCE_EXPORT_ROOT": str(folder / "exports")}
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v", "0"], env=env, cwd=PROJECT, check=True)
    port_file, posts = folder / "port", folder / "posts.jsonl"
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.webhook_receiver", SECRET, str(port_file), str(posts)], cwd=PROJECT, env=env
        )
    ]
    try:
        while not (port_file.exists() and port_file.read_text()):
            time.sleep(0.05)
        hook = f"http://127.0.0.1:{port_file.read_text()}/hook"
        subprocess.run([*manage, "shell", "-c", RULE.format(url=hook, secret=SECRET)], env=env, cwd=PROJECT, check=True)
        with (folder / "watch.log").open("ab") as log:
            processes.append(subprocess.Popen([*manage, "import_runs", "--watch", str(root)], env=env, cwd=PROJECT,
                                              stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
            processes.append(subprocess.Popen([*manage, "db_worker", "--no-reload"], env=env, cwd=PROJECT,
                                              stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
        time.sleep(5)  # both started, the first pass done
        seconds = []
        for number in range(options.trials):
            run_id = f"doubt-{number:02d}"
            run_dir = root / run_id
            runtime.run_init(run_dir, contract_sha256=CONTRACT)
            message = json.dumps({"to": f"customer-{number}@example.com", "body": "Your refund is on its way"})
            command = [sys.executable, "-m", "receipts", "call", str(run_dir), "--tool", "send_message",
                       "--attempt", "1", "--args", message]  # fmt: skip
            subprocess.run(command, env={**env, "RECEIPTS_FAILPOINT": "after_effect"}, cwd=PROJECT, check=False)
            written = max(path.stat().st_mtime for path in (run_dir / "receipts").iterdir())
            deadline = time.time() + 120
            arrived = None
            while arrived is None and time.time() < deadline:
                time.sleep(0.05)
                for line in posts.read_text().splitlines() if posts.exists() else []:
                    post = json.loads(line)
                    if post["body"]["item"]["run_id"] == run_id and post["verified"]:
                        arrived = post["at"]
            if arrived is None:
                raise SystemExit(f"no POST about {run_id} within 120 s: see {folder}/watch.log")
            seconds.append(arrived - written)
            print(f"{run_id}: {arrived - written:.2f} s", flush=True)
            time.sleep(0.5 + (number % 4) * 0.7)  # trials at different moments of the watch's cycle
        seconds.sort()
        p95 = seconds[max(0, round(0.95 * len(seconds)) - 1)]
        print(f"{options.database}: {len(seconds)} trials, p50 {statistics.median(seconds):.2f} s, "
              f"p95 {p95:.2f} s, worst {seconds[-1]:.2f} s")  # fmt: skip
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
