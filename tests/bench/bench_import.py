"""Import benchmark (run by hand: `make bench-import`; not part of the suite).

Builds (once, cached under tests/bench/out/) a run of 1,000,000 ledger events
and 100,000 receipts, then in the same run times:
- the importer (`manage.py import_runs`) into a fresh database;
- the floor: a plain script that parses the same files with the standard
  `json` module and inserts the same rows (events and calls, the same
  columns) in one transaction, with `sqlite3` (or psycopg for PostgreSQL);
- re-importing the unchanged run (the whole command);
- re-importing it after one receipt was replaced, as the writer replaces one
  (a new file renamed over it): only that file is read again;
- peak memory of the import at a quarter and at the whole ledger (flat = streamed).

    python tests/bench/bench_import.py [--events N] [--receipts N] [--postgres]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "out"
CONTRACT = "c" * 64
PG_URL = "postgres://postgres@127.0.0.1:5432/test"

FLOOR = Path(__file__).resolve().parent / "floor_import.py"


def build_run(events: int, receipts: int) -> Path:
    run = OUT / f"run-{events}-{receipts}"
    if (run / "events.jsonl").exists():
        return run
    shutil.rmtree(run, ignore_errors=True)
    sys.path.insert(0, str(PROJECT))
    from tests.volume import synthetic_run

    started = time.perf_counter()
    synthetic_run(run, events=events, receipts=receipts, contract=CONTRACT)
    print(f"built {run.name} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return run


def env_for(url: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": url, "DJANGO_DEBUG": "1"}


def manage(url: str, *args: str) -> tuple[float, float]:
    """Wall time of ``manage.py ARGS`` and its peak RSS in MiB (GNU time not needed)."""
    code = (
        "import resource, runpy, sys, time\n"
        "sys.argv = ['manage.py', *sys.argv[1:]]\n"
        "started = time.perf_counter()\n"
        "try:\n"
        "    runpy.run_path('manage.py', run_name='__main__')\n"
        "finally:\n"
        "    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
        "    print(time.perf_counter() - started, rss, file=sys.stderr)"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code, *args], env=env_for(url), cwd=PROJECT, capture_output=True, text=True, check=True
    )
    seconds, rss = completed.stderr.strip().splitlines()[-1].split()
    return float(seconds), float(rss)


def fresh_database(postgres: bool, name: str) -> str:
    if postgres:
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name}")
        url = PG_URL.rsplit("/", 1)[0] + f"/{name}"
    else:
        path = OUT / f"{name}.sqlite3"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        url = f"sqlite:///{path}"
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], env=env_for(url), cwd=PROJECT, check=True)
    return url


def floor(url: str, run: Path) -> float:
    target = url if url.startswith("postgres") else url[len("sqlite:///") :]
    completed = subprocess.run(
        [sys.executable, str(FLOOR), str(run), target], capture_output=True, text=True, check=True
    )
    return float(completed.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--receipts", type=int, default=100_000)
    parser.add_argument("--postgres", action="store_true", help=f"measure on {PG_URL} instead of SQLite")
    options = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    run = build_run(options.events, options.receipts)
    quarter = build_run(options.events // 4, options.receipts)  # the same receipts: only the ledger grows
    label = "PostgreSQL" if options.postgres else "SQLite"

    url = fresh_database(options.postgres, "bench_floor")
    floor_seconds = floor(url, run)

    url = fresh_database(options.postgres, "bench_import")
    import_seconds, import_rss = manage(url, "import_runs", str(run))
    again_seconds, _ = manage(url, "import_runs", str(run))
    receipt = min((run / "receipts").iterdir())
    replacement = receipt.with_name(f".{receipt.name}.bench")
    shutil.copyfile(receipt, replacement)
    os.replace(replacement, receipt)  # the same bytes under a new inode: its signature changed
    one_changed_seconds, _ = manage(url, "import_runs", str(run))
    url_quarter = fresh_database(options.postgres, "bench_quarter")
    _, quarter_rss = manage(url_quarter, "import_runs", str(quarter))

    print(f"{label}: {options.events:,} events, {options.receipts:,} receipts")
    print(f"  floor (json + executemany, one transaction): {floor_seconds:7.1f} s")
    ratio = import_seconds / floor_seconds
    print(f"  import_runs, fresh database:                 {import_seconds:7.1f} s  ({ratio:.2f}x the floor)")
    print(f"  import_runs again, run unchanged:            {again_seconds:7.2f} s")
    print(f"  import_runs after one receipt changed:       {one_changed_seconds:7.2f} s")
    sizes = f"{options.events // 4:,} events, {import_rss:.0f} MiB at {options.events:,}"
    print(f"  peak memory: {quarter_rss:.0f} MiB at {sizes}")
    print(
        json.dumps(
            {
                "db": label,
                "floor_s": floor_seconds,
                "import_s": import_seconds,
                "unchanged_s": again_seconds,
                "one_receipt_changed_s": one_changed_seconds,
                "rss_quarter_mib": quarter_rss,
                "rss_full_mib": import_rss,
            }
        )
    )


if __name__ == "__main__":
    main()
