"""The writer daemon's peak memory with 64 clients sending their largest message at once.

Not part of the suite. A daemon (``python -m receipts serve``) with the default ``--max-clients``
(64) and ``--max-memory`` (512 MiB, or ``--max-memory``); 64 processes connect at the same
moment (a barrier) and each sends one line of its kind:

- ``empty-objects``: the wire's largest line of ``{},{},...`` (the attack of issue 55, case 3);
- ``largest-args``: a call whose arguments are the largest the writer takes, 4 MiB of short
  strings, as many values as it takes (250,000); its client retries while the writer is busy;
- ``largest-text``: a call whose arguments are one 4 MiB string.

Printed: the daemon's resident memory before, its peak (VmHWM) after, what stayed (VmRSS), and
how each client's request ended. The daemon runs as this user; its runs root is a temporary
folder.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from receipts import client, protocol, runtime

CONTRACT = protocol.sha256_hex(b"bench-serve-memory")


def memory_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def empty_objects(run: str) -> bytes:
    head = b'{"op": "call", "run": "' + run.encode() + b'", "args": {"x": ['
    items = (client.MAX_MESSAGE_BYTES - len(head) - 10) // 3
    return head + b"{}," * items + b"{}]}}\n"


def send_line(socket_path: str, line: bytes) -> str:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(600)
        sock.connect(socket_path)
        try:
            sock.sendall(line)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = sock.makefile("rb").readline()
    try:
        return str(json.loads(answer)["error"]["type"])
    except (ValueError, KeyError, TypeError):
        return "closed"


class Tagging:
    """A tool whose arguments are any object: its effect is a count, its result a small object."""

    name, version = "tagging", "1"

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return dict(args)

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        return {"tagged": len(args.get("tags", []))}


_barrier: list = []


def _keep_barrier(barrier: object) -> None:
    _barrier.append(barrier)


def one_client(kind: str, socket_path: str, run: str, number: int) -> str:
    barrier = _barrier[0]
    if kind == "empty-objects":
        line = empty_objects(run)
        barrier.wait()
        return send_line(socket_path, line)
    if kind == "largest-args":
        # Short strings, as many as a value may hold, within the 4 MiB of arguments.
        args = {"n": number, "tags": [f"t{index % 1000}" for index in range(240_000)]}
    else:
        args = {"n": number, "text": "y" * (4 * 1024 * 1024 - 200)}
    executor = runtime.Executor(Path(run), {"tagging": Tagging()}, writer_socket=socket_path)
    barrier.wait()
    try:
        outcome = executor.call("tagging", args, attempt=1)
    except (OSError, ValueError) as error:
        return type(error).__name__
    return str(outcome.status)


def measure(kind: str, clients: int, max_memory: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="bench-serve-memory-") as base:
        root, socket_path = Path(base) / "runs", str(Path(base) / "writer.sock")
        root.mkdir(mode=0o755)
        log = Path(base) / "daemon.log"
        with log.open("wb") as output:  # a file: a pipe nobody reads would stop its log, and it
            daemon = subprocess.Popen(
                [sys.executable, "-m", "receipts", "serve", str(root), "--socket", socket_path,
                 "--max-memory", str(max_memory)],
                stdout=output, stderr=output,
            )  # fmt: skip
        try:
            while b'"serving"' not in log.read_bytes():
                if daemon.poll() is not None:
                    raise RuntimeError(log.read_text())
                time.sleep(0.05)
            run = root / "run"
            runtime.run_init(run, contract_sha256=CONTRACT, writer_socket=socket_path)
            before = memory_mib(daemon.pid, "VmRSS")
            started = time.perf_counter()
            context = multiprocessing.get_context("spawn")
            barrier = context.Barrier(clients)
            with context.Pool(clients, initializer=_keep_barrier, initargs=(barrier,)) as pool:
                ends = pool.starmap(one_client, [(kind, socket_path, str(run), number) for number in range(clients)])
            seconds = time.perf_counter() - started
            return {
                "kind": kind,
                "clients": clients,
                "max_memory_mib": max_memory,
                "rss_before_mib": round(before, 1),
                "peak_mib": round(memory_mib(daemon.pid, "VmHWM"), 1),
                "rss_after_mib": round(memory_mib(daemon.pid, "VmRSS"), 1),
                "seconds": round(seconds, 1),
                "ends": dict(Counter(ends)),
            }
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--max-memory", type=int, default=512, metavar="MIB")
    parser.add_argument("--kind", choices=("empty-objects", "largest-args", "largest-text"), action="append")
    options = parser.parse_args()
    for kind in options.kind or ("empty-objects", "largest-args", "largest-text"):
        print(json.dumps(measure(kind, options.clients, options.max_memory)), flush=True)


if __name__ == "__main__":
    main()
