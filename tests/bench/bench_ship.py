"""The shipper benchmark (run by hand; not part of the suite): its memory whatever the ledger's
size, and a decision's way to its host while that host ships a big run.

A real dashboard: gunicorn (2 workers) on PostgreSQL (the database ``imp_ship``, made again by
each run), its mirror under tests/bench/out/; a real ``callproof ship`` (its own process, no
database, no Django) of a runs root holding ``--doubts`` small runs, each with a message in doubt
(the writer killed after the effect), shipped and imported first. Then a run of ``--events``
ledger events and ``--receipts`` receipts (bench_import's, built once and cached, hard-linked
here) is put in the root, and the shipper's next pass ships it whole:

- memory: the shipper's peak resident memory over that pass (the kernel's high-water mark,
  VmHWM), and how long the pass took to put the whole ledger in the mirror;
- delivery: while that pass pushes, this process settles the calls in doubt one after another,
  as a web process does (``settle.settle_call``), and times each from the settle to its
  confirmation file in the host's run directory; it says how many were written while the big
  run was still on its way.

    python tests/bench/bench_ship.py [--events N] [--receipts N] [--doubts N] [--shipper-tree DIR]

``--shipper-tree`` runs the shipper of another checkout (``git worktree add DIR COMMIT``) against
this dashboard: an earlier shipper measured the same way.
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
PG_NAME = "imp_ship"
HOST = "agent-host"


def vm(pid: int, field: str) -> float:
    """A field of /proc/PID/status in MiB (VmRSS, VmHWM); 0 once the process is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0.0
    return next((int(line.split()[1]) / 1024 for line in lines if line.startswith(f"{field}:")), 0.0)


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--receipts", type=int, default=100_000)
    parser.add_argument("--doubts", type=int, default=20)
    parser.add_argument("--shipper-tree", type=Path, default=PROJECT, help="the checkout whose shipper runs")
    options = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    sys.path.insert(0, str(PROJECT))
    from tests.bench.bench_delivery import doubtful_runs, fresh_database
    from tests.bench.bench_import import build_run

    big = build_run(options.events, options.receipts)
    work = OUT / "ship"
    shutil.rmtree(work, ignore_errors=True)
    root, mirror, home = work / "root", work / "mirror", work / "home"
    for folder in (root, mirror, home):
        folder.mkdir(parents=True)
    runs = doubtful_runs(root, options.doubts)
    url = fresh_database(PG_NAME)
    os.environ.update({"DATABASE_URL": url, "DJANGO_DEBUG": "1", "DJANGO_SETTINGS_MODULE": "evidence.settings",
                       "EVIDENCE_MIRROR_ROOT": str(mirror)})  # fmt: skip
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command

    from evidence.ingest import shipping
    from evidence.lib import roles
    from evidence.models import Call
    from evidence.review import settle

    (home / "key").write_text(shipping.new_key(HOST) + "\n")
    port = free_port()
    web_env = {**os.environ, "DJANGO_DEBUG": "0", "DJANGO_HTTPS": "0", "DJANGO_SECRET_KEY": "bench-" + "k" * 50,
               "DJANGO_ALLOWED_HOSTS": "127.0.0.1", "EVIDENCE_HOST_NAME": "web-host"}  # fmt: skip
    web = subprocess.Popen([sys.executable, "-m", "gunicorn", "evidence.wsgi", "-b", f"127.0.0.1:{port}", "-w", "2"],
                           cwd=PROJECT, env=web_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    ship_env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(options.shipper_tree.resolve())}
    command = [sys.executable, "-m", "receipts", "ship", str(root), "--to", f"http://127.0.0.1:{port}",
               "--key-file", str(home / "key"), "--state", str(home / "state.sqlite3")]  # fmt: skip
    shipper = None
    try:
        time.sleep(3)  # gunicorn's workers start; the first pass below tries again if they have not
        for _ in range(20):
            if subprocess.run([*command, "--once"], env=ship_env, capture_output=True, cwd=home).returncode == 0:
                break
            time.sleep(1)
        call_command("import_mirrors", verbosity=0)
        person = User.objects.create_user("dana")
        person.groups.add(roles.ensure_roles()["confirmer"])

        subprocess.run(["cp", "-al", str(big), str(root / "big-run")], check=True)  # the next pass ships it
        ledger = root / "big-run" / "events.jsonl"
        copy = mirror / HOST / "big-run" / "events.jsonl"
        started = time.monotonic()
        shipper = subprocess.Popen([*command, "--interval", "1"], env=ship_env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, cwd=home)  # fmt: skip
        while not (mirror / HOST / "big-run").exists():
            assert shipper.poll() is None, "the shipper ended"
            time.sleep(0.05)
        seconds, during = [], 0
        for run_dir in runs:
            call = Call.objects.select_related("run").get(run__run_id=run_dir.name)
            confirmation = run_dir / "confirmations" / f"{call.call_id}.json"
            settled_at = time.monotonic()
            settle.settle_call(run=call.run, call=call, user=person, resolution="committed", reason="the log has it",
                               typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256)  # fmt: skip
            while not confirmation.exists():
                time.sleep(0.02)
            seconds.append(time.monotonic() - settled_at)
            during += not (copy.exists() and copy.stat().st_size == ledger.stat().st_size)
            time.sleep(1)
        rss_peak = 0.0
        while not (copy.exists() and copy.stat().st_size == ledger.stat().st_size):
            assert shipper.poll() is None, "the shipper ended"
            rss_peak = max(rss_peak, vm(shipper.pid, "VmRSS"))
            time.sleep(0.2)
        shipped = time.monotonic() - started
        hwm = vm(shipper.pid, "VmHWM")
    finally:
        for process in (shipper, web):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(60)
    ordered = sorted(seconds)
    p95 = ordered[max(0, round(0.95 * len(ordered)) - 1)]
    size = ledger.stat().st_size
    print(f"a run of {options.events:,} events and {options.receipts:,} receipts ({size / 2**20:,.0f} MiB of ledger) "
          f"shipped in {shipped:.1f} s ({size / 2**20 / shipped:.1f} MiB/s)")  # fmt: skip
    print(f"  the shipper's peak resident memory (VmHWM): {hwm:.1f} MiB (sampled RSS peak {rss_peak:.1f} MiB)")
    print(f"  {len(seconds)} decisions, {during} written while the run was on its way")
    print(f"  settle to confirmation file on the host: p50 {statistics.median(seconds):.2f} s, p95 {p95:.2f} s, "
          f"max {max(seconds):.2f} s")  # fmt: skip
    print(json.dumps({"events": options.events, "receipts": options.receipts, "ledger_bytes": size,
                      "shipped_s": shipped, "vmhwm_mib": hwm, "decisions": len(seconds), "during": during,
                      "seconds": seconds}))  # fmt: skip


if __name__ == "__main__":
    main()
