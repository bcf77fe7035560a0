"""Export benchmark (run by hand: `make bench-export`; not part of the suite).

Builds (once, cached under tests/bench/out/) a run of N ledger events and N/10
receipts, imports it into a fresh SQLite database, then times
``manage.py export_evidence`` and ``manage.py verify_evidence`` and reports each
one's peak memory, at a quarter of N and at N (flat = streamed).

    python tests/bench/bench_export.py [--events N]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.bench_import import OUT, build_run, manage


def measure(events: int) -> None:
    run = build_run(events, events // 10)
    database = OUT / f"export-{events}.sqlite3"
    database.unlink(missing_ok=True)
    url = f"sqlite:///{database}"
    manage(url, "migrate", "-v", "0")
    manage(url, "import_runs", str(run))
    out = OUT / f"export-{events}"
    shutil.rmtree(out, ignore_errors=True)
    seconds, peak = manage(url, "export_evidence", run.name, "--out", str(out))
    size = (out / "evidence.json").stat().st_size / 2**20
    print(f"{events:>9,} events: export {seconds:6.1f} s, peak {peak:5.0f} MiB, evidence.json {size:6.1f} MiB")
    seconds, peak = manage(url, "verify_evidence", str(out))
    print(f"{events:>9,} events: verify {seconds:6.1f} s, peak {peak:5.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    options = parser.parse_args()
    for events in (options.events // 4, options.events):
        measure(events)


if __name__ == "__main__":
    main()
