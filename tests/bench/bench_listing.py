"""A run's listing on disk (``SpillingMap``), by hand: `python tests/bench/bench_listing.py`; not part
of the suite.

What the importer pays for not holding a big run's listing in memory: a million receipts' names and
signatures written (as ``run_fingerprint`` writes them, a chunk of files at a time), read back in
sorted order (``receipt_buckets``: the index is made at that first read), counted, and asked about one
name at a time; beside the same in a dict, and beside a listing that keeps its index as it is written.
"""

from __future__ import annotations

import argparse
import hashlib
import resource
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from receipts.reader.diskset import SpillingMap

SIGNATURE = "1234.1765000000000000000.1765000000000000000.12345678"  # as long as a real one
CHUNK = 4096  # run_fingerprint's


def measure(listing: SpillingMap | dict[str, str], names: list[str]) -> dict[str, float]:
    started = time.perf_counter()
    for start in range(0, len(names), CHUNK):
        listing.update((name, SIGNATURE) for name in names[start : start + CHUNK])
    written = time.perf_counter()
    items = listing.sorted_items() if isinstance(listing, SpillingMap) else sorted(listing.items())
    read = sum(1 for _ in items)
    sorted_read = time.perf_counter()
    assert read == len(listing) == len(names)
    counted = time.perf_counter()
    asked = sum(1 for name in names[:: len(names) // 1000] if name in listing)
    looked_up = time.perf_counter()
    assert asked >= 1000
    return {
        "write": written - started,
        "sorted read": sorted_read - written,
        "count": counted - sorted_read,
        "1,000 lookups": looked_up - counted,
    }


def kept_sorted_as_written(names: list[str]) -> float:
    """The first design: a primary key, so that every insert goes into the sorted tree."""
    db = sqlite3.connect("", isolation_level=None)
    db.execute("PRAGMA cache_size=-16384")
    db.execute("CREATE TABLE entries (name BLOB PRIMARY KEY, value TEXT) WITHOUT ROWID")
    started = time.perf_counter()
    for start in range(0, len(names), 20_000):
        with db:
            db.execute("BEGIN")
            db.executemany(
                "INSERT OR REPLACE INTO entries VALUES (?, ?)",
                [(name.encode(), SIGNATURE) for name in names[start : start + 20_000]],
            )
    seconds = time.perf_counter() - started
    db.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=1_000_000)
    options = parser.parse_args()
    names = [hashlib.sha256(str(index).encode()).hexdigest() + ".json" for index in range(options.names)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    on_disk = measure(SpillingMap(in_memory=10_000), names)
    after_disk = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    in_memory = measure({}, names)
    after_dict = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{options.names:,} names (the list of them: {before:.0f} MiB of the process)")
    for step in on_disk:
        print(f"  {step:<14} on disk {on_disk[step]:6.2f} s   in a dict {in_memory[step]:6.2f} s")
    print(f"  peak memory: on disk +{after_disk - before:.0f} MiB, in a dict +{after_dict - after_disk:.0f} MiB")
    print(f"  written with the index kept as written: {kept_sorted_as_written(names):.2f} s")


if __name__ == "__main__":
    main()
