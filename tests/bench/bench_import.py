"""Import benchmark (run by hand: `make bench-import`; not part of the suite).

Builds (once, cached under tests/bench/out/) a run of 1,000,000 ledger events
and 100,000 receipts, then in the same run times:
- the floor and the importer interleaved, ``--rounds`` times each (floor,
  import, floor, import ...), each on a fresh database, so that a change in the
  machine's load moves both: the floor is a plain script that parses the same
  files with the standard `json` module and inserts the same rows (events and
  calls, the same columns) in one transaction, with `sqlite3` (or psycopg for
  PostgreSQL); the import is `manage.py import_runs`. Reported: each one's
  minimum and median, and the ratio's (each import against the floor of its
  own round);
- re-importing the unchanged run (the whole command);
- re-importing it after one receipt was replaced, as the writer replaces one
  (a new file renamed over it): only that file is read again;
- peak memory of the import at a quarter and at the whole ledger (flat =
  streamed): of the importer's own process, and of its process tree (the
  read-ahead children included; /proc sampled every 20 ms, the sum of the
  tree's resident sets at its highest).

    python tests/bench/bench_import.py [--events N] [--receipts N] [--rounds N] [--postgres]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
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


def tree_rss_mib(pid: int) -> float:
    """The resident memory of ``pid`` and every process below it, in MiB (0 once it is gone)."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except (OSError, StopIteration, ValueError):
            continue  # a process that ended between two reads
    return total / 1024


def manage(url: str, *args: str) -> tuple[float, float, float]:
    """Wall time of ``manage.py ARGS``, its own peak RSS and its process tree's, in MiB."""
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
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args], env=env_for(url), cwd=PROJECT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    peak = [0.0]

    def sample() -> None:
        while process.poll() is None:
            peak[0] = max(peak[0], tree_rss_mib(process.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = process.communicate()
    sampler.join()
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, process.args, stderr=stderr)
    seconds, rss = stderr.strip().splitlines()[-1].split()
    return float(seconds), float(rss), peak[0]


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
    parser.add_argument("--rounds", type=int, default=3, help="floor and import, interleaved, this many times each")
    parser.add_argument("--postgres", action="store_true", help=f"measure on {PG_URL} instead of SQLite")
    options = parser.parse_args()
    if options.rounds < 1:
        parser.error("--rounds: at least 1")
    OUT.mkdir(exist_ok=True)
    run = build_run(options.events, options.receipts)
    quarter = build_run(options.events // 4, options.receipts)  # the same receipts: only the ledger grows
    label = "PostgreSQL" if options.postgres else "SQLite"

    load_before = os.getloadavg()[0]
    floors, imports, ratios = [], [], []
    for _ in range(options.rounds):  # interleaved: a change in the machine's load moves both
        floors.append(floor(fresh_database(options.postgres, "bench_floor"), run))
        url = fresh_database(options.postgres, "bench_import")
        import_seconds, import_rss, import_tree = manage(url, "import_runs", str(run))
        imports.append(import_seconds)
        ratios.append(imports[-1] / floors[-1])
    again_seconds, *_ = manage(url, "import_runs", str(run))
    receipt = min((run / "receipts").iterdir())
    replacement = receipt.with_name(f".{receipt.name}.bench")
    shutil.copyfile(receipt, replacement)
    os.replace(replacement, receipt)  # the same bytes under a new inode: its signature changed
    one_changed_seconds, *_ = manage(url, "import_runs", str(run))
    url_quarter = fresh_database(options.postgres, "bench_quarter")
    _, quarter_rss, quarter_tree = manage(url_quarter, "import_runs", str(quarter))
    load_after = os.getloadavg()[0]

    def spread(values: list[float], unit: str = " s") -> str:
        return f"min {min(values):7.2f}{unit}, median {statistics.median(values):7.2f}{unit}"

    rounds = f"{options.rounds} round{'s' if options.rounds != 1 else ''}"
    print(f"{label}: {options.events:,} events, {options.receipts:,} receipts, {rounds} interleaved, "
          f"load average {load_before:.2f} at the start, {load_after:.2f} at the end")  # fmt: skip
    print(f"  floor (json + executemany, one transaction): {spread(floors)}")
    print(f"  import_runs, fresh database:                 {spread(imports)}")
    print(f"  import against its round's floor:            {spread(ratios, 'x')}")
    print(f"  import_runs again, run unchanged:            {again_seconds:7.2f} s")
    print(f"  import_runs after one receipt changed:       {one_changed_seconds:7.2f} s")
    sizes = f"{options.events // 4:,} / {options.events:,} events"
    print(f"  peak memory at {sizes}: importer {quarter_rss:.0f} / {import_rss:.0f} MiB, "
          f"process tree {quarter_tree:.0f} / {import_tree:.0f} MiB")  # fmt: skip
    print(
        json.dumps(
            {
                "db": label,
                "rounds": options.rounds,
                "load_average": [load_before, load_after],
                "floor_s": floors,
                "import_s": imports,
                "ratio": ratios,
                "unchanged_s": again_seconds,
                "one_receipt_changed_s": one_changed_seconds,
                "rss_quarter_mib": quarter_rss,
                "rss_full_mib": import_rss,
                "tree_rss_quarter_mib": quarter_tree,
                "tree_rss_full_mib": import_tree,
            }
        )
    )


if __name__ == "__main__":
    main()
