"""Writer benchmark (run by hand: `make bench`; not part of the suite).

Measures, on real files with every fsync:
- write_task calls per second, one process (new ids; and reuse of one id);
- write_task under 8-way contention, one id and distinct ids (8 processes);
- receipts per second through the executor (each call writes prepared and
  committed, so two receipts and two ledger lines per call);
- on a big run (1,000,000 ledger lines, 100,000 receipts; `--big-events`):
  a state change to the next attempt, which reads the whole run to find the
  calls in doubt, and one call, which reads only its own files.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from receipts import protocol, runtime
from receipts.demo import login_request
from tests.volume import synthetic_run

CONTRACT = protocol.sha256_hex(b"bench")


def new_run(root: Path, name: str) -> Path:
    run_dir = root / name
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    return run_dir


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:8.1f}/s  ({count} in {seconds:.2f} s)"


def single_process(root: Path, count: int) -> None:
    run_dir = new_run(root, "single")
    started = time.perf_counter()
    for number in range(count):
        runtime.write_task(run_dir, login_request(), f"sub-{number}")
    print(f"write_task, 1 process, new ids:        {rate(count, time.perf_counter() - started)}")
    started = time.perf_counter()
    for _ in range(count):
        runtime.write_task(run_dir, login_request(), "sub-0")
    print(f"write_task, 1 process, reused id:      {rate(count, time.perf_counter() - started)}")


def _worker(args: tuple[str, int, str]) -> int:
    run_dir, count, prefix = args
    for number in range(count):
        submission = "shared" if prefix == "shared" else f"{prefix}-{number}"
        runtime.write_task(Path(run_dir), login_request(), submission)
    return count


def contended(root: Path, count: int, shared: bool) -> None:
    run_dir = new_run(root, "shared" if shared else "distinct")
    jobs = [(str(run_dir), count, "shared" if shared else f"w{index}") for index in range(8)]
    with multiprocessing.get_context("fork").Pool(8) as pool:
        started = time.perf_counter()
        total = sum(pool.map(_worker, jobs))
        elapsed = time.perf_counter() - started
    label = "one id" if shared else "distinct ids"
    print(f"write_task, 8 processes, {label + ':':<14}{rate(total, elapsed)}")


def executor(root: Path, count: int) -> None:
    run_dir = new_run(root, "executor")
    calls = runtime.Executor(run_dir)
    started = time.perf_counter()
    for number in range(count):
        calls.call("write_file", {"path": f"f{number}.txt", "content": "x"}, attempt=1)
    elapsed = time.perf_counter() - started
    print(f"executor write_file calls:             {rate(count, elapsed)}")
    print(f"receipts written through the executor: {rate(2 * count, elapsed)}")


def big_run(root: Path, events: int) -> None:
    run_dir = root / "big"
    started = time.perf_counter()
    synthetic_run(run_dir, events=events, receipts=events // 10, contract=CONTRACT)
    (run_dir / "state.json").write_text('{"name": "running", "attempts": 1}')
    print(f"built a run of {events:,} events, {events // 10:,} receipts in {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    runtime.run_set_state(run_dir, state="retrying", attempts=1)
    print(f"state retrying (reads the whole run):  {time.perf_counter() - started:8.2f} s")
    calls = runtime.Executor(run_dir)
    started = time.perf_counter()
    calls.call("write_file", {"path": "one-more.txt", "content": "x"})
    print(f"one call on that run (attempt 2):      {(time.perf_counter() - started) * 1000:8.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500, help="calls per measurement (per process when contended)")
    parser.add_argument("--big-events", type=int, default=1_000_000, help="ledger lines of the big run (0: skip)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir on the project's disk)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=options.dir or Path(__file__).parent) as temp:
        root = Path(temp)
        single_process(root, options.count)
        contended(root, options.count // 4, shared=True)
        contended(root, options.count // 4, shared=False)
        executor(root, options.count)
        if options.big_events:
            big_run(root, options.big_events)


if __name__ == "__main__":
    main()
