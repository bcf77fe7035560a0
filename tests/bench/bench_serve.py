"""Calls per second through the writer daemon's socket against the writer in process (`make bench-serve`).

Not part of the suite. On real files with every fsync: ``write_file`` calls, each a new
call (a prepared and a committed receipt, two ledger lines) and each the same call again
(a reuse: its receipt read and checked, the file checked, one ledger line); one process,
then four at once. In process and through the socket are measured interleaved, round by
round, so that the machine's load falls on both alike; min and median of the rounds.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from receipts import protocol, runtime
from receipts.demo import PACKAGE_PARENT

CONTRACT = protocol.sha256_hex(b"bench-serve")


def calls(run_dir: str, socket: str, first: int, count: int, same: bool) -> float:
    executor = runtime.Executor(Path(run_dir), writer_socket=socket)
    started = time.perf_counter()
    for number in range(first, first + count):
        name = "same" if same else f"n{number}"
        outcome = executor.call("write_file", {"path": f"f/{name}.txt", "content": name})
        assert outcome.status == "committed", outcome
    return time.perf_counter() - started


def one_round(root: Path, socket: str, label: str, count: int, processes: int, same: bool) -> float:
    run_dir = root / f"{label}-{processes}-{same}-{time.monotonic_ns()}"
    runtime.run_init(run_dir, contract_sha256=CONTRACT, writer_socket=socket)
    if same:
        calls(str(run_dir), socket, 0, 1, True)  # the call made once; what follows reuses it
    started = time.perf_counter()
    if processes == 1:
        calls(str(run_dir), socket, 0, count, same)
    else:
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            pool.starmap(calls, [(str(run_dir), socket, index * count, count, same) for index in range(processes)])
    return processes * count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=300, help="calls per process and round")
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as scratch:
        root = Path(scratch) / "runs"
        root.mkdir()
        socket = str(Path(scratch) / "writer.sock")
        env = dict(os.environ, PYTHONPATH=PACKAGE_PARENT)
        env.pop("RECEIPTS_WRITER_SOCKET", None)
        daemon = subprocess.Popen([sys.executable, "-m", "receipts", "serve", str(root), "--socket", socket],
                                  env=env, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            while not os.path.exists(socket):
                time.sleep(0.01)
            print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, {options.rounds} rounds, "
                  f"{options.calls} calls per process and round")  # fmt: skip
            for processes, same in ((1, False), (1, True), (4, False)):
                rates: dict[str, list[float]] = {"in process": [], "socket": []}
                for _ in range(options.rounds):
                    rates["in process"].append(one_round(root, "", "local", options.calls, processes, same))
                    rates["socket"].append(one_round(root, socket, "served", options.calls, processes, same))
                what = f"{'reused' if same else 'new'} calls, {processes} process{'es' if processes > 1 else ''}"
                for label, values in rates.items():
                    print(f"{what:<24} {label:<11} min {min(values):7.1f}/s  median {statistics.median(values):7.1f}/s")
                ratio = statistics.median(rates["in process"]) / statistics.median(rates["socket"])
                print(f"{what:<24} socket costs {ratio:.2f}x the time in process (medians)")
        finally:
            daemon.terminate()
            daemon.wait()


if __name__ == "__main__":
    main()
