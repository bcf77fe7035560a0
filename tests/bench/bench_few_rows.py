"""Few-rows benchmark (run by hand; not part of the suite): what an import that brings a few new
lines costs on PostgreSQL, with the rows taken by a pipelined ``executemany`` or through the
temporary table ``COPY`` fills (``storing.bulk_upsert``, ``FEW_ROWS``).

Builds 50 small runs (20 events, 2 receipts each), imports them into a fresh database, then in
--rounds rounds appends one event to each run and imports each run again, once with
``FEW_ROWS`` as it is and once with 0 (every batch through the temporary table), the two in turn
so that a machine's drift weighs on both alike. Prints the median time of a run's import for each.

    python tests/bench/bench_few_rows.py [--runs N] [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT))

from tests.bench.bench_watch import CONTRACT, OUT, fresh_database  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=10)
    options = parser.parse_args()
    url = fresh_database(postgres=True)
    os.environ.update({"DATABASE_URL": url, "DJANGO_DEBUG": "1", "DJANGO_SETTINGS_MODULE": "evidence.settings"})
    import django

    django.setup()
    from evidence.ingest import importer, storing
    from tests.volume import synthetic_ledger, synthetic_run

    root = OUT / "few-rows-root"
    shutil.rmtree(root, ignore_errors=True)
    runs = [root / f"run-{number:03d}" for number in range(options.runs)]
    for run_dir in runs:
        synthetic_run(run_dir, events=20, receipts=2, contract=CONTRACT)
        importer.run_import(path=run_dir)
    few_rows, seq = storing.FEW_ROWS, 21
    times: dict[int, list[float]] = {few_rows: [], 0: []}
    for _ in range(options.rounds):
        for setting in (few_rows, 0):
            storing.FEW_ROWS = setting
            for run_dir in runs:
                synthetic_ledger(run_dir, 1, start_seq=seq)
            for run_dir in runs:
                started = time.perf_counter()
                report = importer.run_import(path=run_dir)
                times[setting].append(time.perf_counter() - started)
                assert report.events == seq, report  # the line just appended, stored
            seq += 1
    for setting, label in ((few_rows, f"executemany (FEW_ROWS {few_rows})"), (0, "temporary table (FEW_ROWS 0)")):
        print(f"{label:34s} median {statistics.median(times[setting]) * 1000:6.1f} ms a run's import "
              f"of one new line ({len(times[setting])} imports)")  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
